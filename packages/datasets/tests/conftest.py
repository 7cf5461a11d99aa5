from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def kernelbench_root() -> Path | None:
    env = os.environ.get("CUDA_AGENT_KERNELBENCH")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "kernelbench"]:
        if (cand / "level1").is_dir():
            return cand
    return None


@pytest.fixture
def kb_root() -> Path:
    root = kernelbench_root()
    if root is None:
        pytest.skip("KernelBench not found (set CUDA_AGENT_KERNELBENCH or provide ../shared/kernelbench)")
    return root



sys.path.insert(0, str(Path(__file__).resolve().parent))
