"""The disk watchdog: kills a session's processes when its workspace grows past the disk
limit (sparse files at their apparent size, preallocated ones at their blocks)."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Callable


def tree_size(root: Path, stop_at: int) -> int:
    total = 0
    stack = [str(root)]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        else:  # sparse files at their apparent size, preallocated ones at their blocks
                            st = e.stat(follow_symlinks=False)
                            total += max(st.st_blocks * 512, st.st_size if e.is_file(follow_symlinks=False) else 0)
                    except OSError:
                        continue
                    if total > stop_at:
                        return total
        except OSError:
            continue
    return total


class DiskWatchdog:
    """Kills the session's processes when the workspace grows past ``limit_mb``."""

    def __init__(self, root: Path, limit_mb: int, on_exceed: Callable[[], None], period: float = 0.5,
                 on_tick: Callable[[], None] | None = None):
        self.root = root
        self.on_tick = on_tick
        self.limit = limit_mb * 1024 * 1024
        self.on_exceed = on_exceed
        self.period = period
        self.exceeded = False
        self.fired = 0  # how many times the session was killed for its size
        self._fired_at = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, name="disk-watchdog", daemon=True)
        if limit_mb > 0 or on_tick is not None:
            self._t.start()

    def check(self) -> bool:
        """Kill the session when the workspace passes the limit, and again each time it grows
        further while over it (commands that only delete files may run)."""
        if self.on_tick is not None:
            with contextlib.suppress(Exception):
                self.on_tick()
        if self.limit <= 0:
            return False
        with self._lock:
            size = tree_size(self.root, self.limit + (64 << 20) + self._fired_at)
            if size > self.limit:
                if not self.exceeded or size > self._fired_at + (8 << 20):
                    self.exceeded = True
                    self._fired_at = size
                    self.fired += 1
                    self.on_exceed()
                return True
            self.exceeded = False
            self._fired_at = 0
            return False

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            with contextlib.suppress(Exception):
                self.check()

    def stop(self) -> None:
        self._stop.set()
