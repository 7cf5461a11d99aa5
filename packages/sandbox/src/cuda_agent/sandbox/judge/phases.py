"""Where a judge job's time went: seconds per named phase, added up over repeated entries."""

from __future__ import annotations

import contextlib
import time
from typing import Iterator


class PhaseClock:
    """``with clock("load"): ...`` adds the block's wall time to ``seconds["load"]``. The
    dict is the caller's (a result's ``phase_seconds``), so it stays plain data."""

    def __init__(self, seconds: dict[str, float] | None = None):
        self.seconds: dict[str, float] = {} if seconds is None else seconds

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - t, 4)
