#!/usr/bin/env python3
"""The test suite's GPU tests (``@pytest.mark.gpu``; skipped where no GPU is seen), run here.

    python3 scripts/gpu/gpu_tests.py             # every package
    python3 scripts/gpu/gpu_tests.py -k graph    # extra arguments go to pytest

Prints pytest's summary; exits with pytest's status (5, no test collected, counts as a failure).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    dirs = [str(p) for p in sorted((REPO / "packages").glob("*/tests"))]
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", *dirs, *sys.argv[1:]]
    rc = subprocess.call(cmd, cwd=REPO)
    print(f"gpu tests: pytest exit status {rc}" + (" (no test collected)" if rc == 5 else ""))
    return 1 if rc == 5 else rc


if __name__ == "__main__":
    raise SystemExit(main())
