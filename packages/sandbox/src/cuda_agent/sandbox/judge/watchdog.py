"""The end of a forward call: a Python-level deadline, and waiting for the device.

:func:`deadline` raises :class:`VerifyTimeout` in Python code that runs too long (the
executor kills a hung kernel); :func:`synchronize` makes a call's end its kernels' end.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator


class VerifyTimeout(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise VerifyTimeout in Python code that runs past ``seconds`` (main thread only)."""
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def _alarm(signum, frame):
        raise VerifyTimeout(f"forward did not finish within {seconds:g} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def synchronize(device: Any) -> None:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
