"""Messages between the trusted judge and the candidate process.

One message is a 4-byte big-endian length and a JSON object, with file descriptors (shared
output buffers) passed beside it (``SCM_RIGHTS``) on a Unix stream socket. JSON and only
JSON crosses from the candidate's side: the trusted side never unpickles what a candidate
process sends, so nothing it sends can run code there. Sizes are bounded on receipt.
"""

from __future__ import annotations

import array
import json
import os
import select
import socket
import struct
import time
from cuda_agent.core.errors import CudaAgentError

MAX_MESSAGE = 64 << 20  # bytes of JSON in one message
MAX_FDS = 64


class WireError(CudaAgentError):
    """The other side sent something malformed, closed the channel, or did not answer in time."""

    def __init__(self, message: str, reason: str = "protocol"):
        super().__init__(message)
        self.reason = reason  # protocol | closed | timeout


def send(sock: socket.socket, msg: dict, fds: list[int] | tuple[int, ...] = ()) -> None:
    data = json.dumps(msg, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise WireError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    frame = struct.pack(">I", len(data)) + data
    if fds:
        if len(fds) > MAX_FDS:
            raise WireError(f"{len(fds)} file descriptors in one message (at most {MAX_FDS})")
        sent = sock.sendmsg([frame[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        if sent != 4:  # pragma: no cover - a 4-byte send on a stream socket
            raise WireError("short send of a message header")
        frame = frame[4:]
    sock.sendall(frame)


def _wait(sock: socket.socket, deadline: float | None) -> None:
    if deadline is None:
        return
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([sock], [], [], left)[0]:
        raise WireError("no answer in time", "timeout")


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        _wait(sock, deadline)
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise WireError("the other side closed the channel", "closed")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket, timeout: float | None = None) -> tuple[dict, list[int]]:
    """The next message and the descriptors that came with it (the caller closes them)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    _wait(sock, deadline)
    fds = array.array("i")
    head, anc, _flags, _addr = sock.recvmsg(4, socket.CMSG_SPACE(MAX_FDS * fds.itemsize))
    received: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    received = list(fds)
    try:
        if not head:
            raise WireError("the other side closed the channel", "closed")
        if len(head) < 4:
            head += _recv_exact(sock, 4 - len(head), deadline)
        (size,) = struct.unpack(">I", head)
        if size > MAX_MESSAGE:
            raise WireError(f"a message of {size} bytes (at most {MAX_MESSAGE})")
        data = _recv_exact(sock, size, deadline)
        try:
            msg = json.loads(data)
        except ValueError as exc:
            raise WireError(f"a message that is not JSON: {exc}") from None
        if not isinstance(msg, dict):
            raise WireError("a message that is not a JSON object")
    except BaseException:
        for fd in received:
            os.close(fd)
        raise
    return msg, received


# --- reading untrusted values --------------------------------------------------------------


def number(msg: dict, key: str, lo: float = float("-inf"), hi: float = float("inf")) -> float:
    v = msg.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise WireError(f"field {key!r}: expected a number in [{lo}, {hi}], got {str(v)[:40]!r}")
    return float(v)


def integer(msg: dict, key: str, lo: int = 0, hi: int = 1 << 62) -> int:
    v = msg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise WireError(f"field {key!r}: expected an integer in [{lo}, {hi}], got {str(v)[:40]!r}")
    return v


def floats(msg: dict, key: str, count: int | None = None) -> list[float]:
    v = msg.get(key)
    if not isinstance(v, list) or (count is not None and len(v) != count):
        raise WireError(f"field {key!r}: expected a list of {count if count is not None else 'some'} numbers")
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x in (float("inf"), float("-inf")):
            raise WireError(f"field {key!r}: {str(x)[:20]!r} is not a finite number")
        out.append(float(x))
    return out


def text(msg: dict, key: str, limit: int = 4000, default: str = "") -> str:
    v = msg.get(key, default)
    if not isinstance(v, str):
        raise WireError(f"field {key!r}: expected text")
    return v[:limit]
