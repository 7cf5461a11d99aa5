"""A child process forked from this one to run a function, seen through the parts of
``subprocess.Popen`` that its owner uses (``pid``, ``poll``, ``wait``, ``kill``,
``returncode``).

The child keeps only the descriptors it is given (its output on 1 and 2, ``/dev/null`` on
0, and ``keep_fds``), takes the environment it is given, runs the function and ends with
its return value; it never returns into the caller's code. Forking is only safe from a
process whose other threads hold no locks the child needs; the caller decides that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable


def _close_all_but(keep: set[int]) -> None:
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


class ForkedChild:
    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def start(cls, run: Callable[[], int], *, output_fd: int, keep_fds: tuple[int, ...] = (),
              env: dict[str, str] | None = None) -> ForkedChild:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return cls(pid)
        code = 1
        try:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(output_fd, 1)
            os.dup2(output_fd, 2)
            _close_all_but({0, 1, 2, *keep_fds})
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            code = int(run() or 0)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - its output says why
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(delay)
            delay = min(0.05, delay * 2)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)
