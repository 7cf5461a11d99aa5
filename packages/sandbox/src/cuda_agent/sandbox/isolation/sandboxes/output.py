"""A command's output read to its end or a deadline, keeping the head and the tail when it
is huge."""

from __future__ import annotations

import os
import select
import time
from typing import Any, Callable


class OutputCollector:
    """Reads a process's stdout to the end, keeping the head and tail when it is huge."""

    def __init__(self, fileobj, limit: int):
        self.f = fileobj
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        half = self.limit // 2
        if len(self.head) < half:
            take = half - len(self.head)
            self.head += data[:take]
            data = data[take:]
        if data:
            self.tail += data
            if len(self.tail) > half:
                cut = len(self.tail) - half
                self.dropped += cut
                del self.tail[:cut]

    def text(self) -> str:
        mid = f"\n[... {self.dropped} bytes of output omitted ...]\n".encode() if self.dropped else b""
        return bytes(self.head + mid + self.tail).decode("utf-8", "replace")


def collect(proc: Any, timeout: float, limit: int, stop: Callable[[], bool] | None = None) -> tuple[str, bool]:
    """Read ``proc.stdout`` until EOF or ``timeout``; returns (output, timed_out)."""
    col = OutputCollector(proc.stdout, limit)
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        if stop is not None and stop():
            break
        r, _, _ = select.select([fd], [], [], min(left, 0.25))
        if not r:
            continue
        data = os.read(fd, 65536)
        if not data:
            break
        col.feed(data)
    return col.text(), timed_out
