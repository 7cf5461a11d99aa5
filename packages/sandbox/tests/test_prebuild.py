"""Single files' extensions built ahead of their verification job (judge.prebuild, judge.pipeline).

The solution below is correct only when its extension was already built and up to date
when its verification job imported it: it compares the library's modification time before
and after ``load_inline`` and returns a wrong result when the job had to build it. So the
test passes only if the build pool's files reached the job's ``TORCH_EXTENSIONS_DIR`` at
the same path with the same flags, and ninja found nothing to do.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.sandbox.executors.local import CpuExecutor, CpuExecutorOptions  # noqa: E402
from cuda_agent.sandbox.judge import prebuild  # noqa: E402
from cuda_agent.sandbox.judge.pipeline import Judge, JudgeOptions  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_verify_support import RELU_TASK  # noqa: E402

SOLUTION = textwrap.dedent(r'''
    import os
    import torch
    import torch.nn as nn
    from torch.utils.cpp_extension import load_inline

    _SRC = """
    torch::Tensor relu_fwd(torch::Tensor x) {
        auto y = torch::empty_like(x);
        const float* a = x.data_ptr<float>();
        float* b = y.data_ptr<float>();
        for (int64_t i = 0; i < x.numel(); ++i) b[i] = a[i] > 0.f ? a[i] : 0.f;
        return y;
    }
    """
    _NAME = "prebuild_test_relu"
    _so = os.path.join(os.environ.get("TORCH_EXTENSIONS_DIR", "/nonexistent"), _NAME, _NAME + ".so")
    _before = os.stat(_so).st_mtime_ns if os.path.exists(_so) else None
    _ext = load_inline(name=_NAME, cpp_sources=_SRC, functions=["relu_fwd"], extra_cflags=["-O0"])
    REUSED = _before is not None and os.stat(_so).st_mtime_ns == _before

    class ModelNew(nn.Module):
        def forward(self, x):
            y = _ext.relu_fwd(x.contiguous())
            return y if REUSED else y + 1.0  # wrong unless the build was found up to date
''')


def _workspace(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "model.py").write_text(RELU_TASK)
    (root / "model_new.py").write_text(SOLUTION)
    (root / ".cuda_agent").mkdir()
    os.chmod(root / ".cuda_agent", 0o755)
    return root


@pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"),
                    reason="the job's private /tmp (same build path in every job) needs root on Linux")
def test_a_single_files_extension_built_ahead_is_up_to_date_in_its_job(tmp_path):
    root = _workspace(tmp_path / "ws")
    opts = JudgeOptions(prebuild=True, build_workers=1, build_jobs=2, prebuilt_cache=str(tmp_path / "cache"),
                        verify_options={"seed": 1, "num_inputs": 1, "extra_draws": [], "rules": "none"})
    executor = CpuExecutor(CpuExecutorOptions(spares=0))
    judge = Judge(opts, executor, backend="cpu")
    try:
        out = judge.judge(root, single_file=True, profile=False)
        v = out.verify
        assert v is not None and v.ok, v.message
        info = v.metadata["prebuild"]
        assert info["built"] == "ahead, without a GPU" and not info["cached"] and info["files"] > 0
        assert v.metadata["prebuilt"].startswith("built ahead")
        assert v.metadata["extensions"].startswith("prebuilt (")
        # the same source again: the store answers, no second build
        again = judge.prebuild(root)
        assert again["cached"] and again["built"] == "ahead, without a GPU"
    finally:
        judge.close()
        executor.close()


def test_only_a_build_of_exactly_the_judged_source_is_used(tmp_path):
    root = _workspace(tmp_path / "ws")
    files = [("ext/a.txt", 0o644, 1_000_000_000, b"x")]
    res = prebuild.PrebuildResult(key=prebuild.source_key(b"other source", ""), files=files, imported=True)
    store = prebuild.PrebuiltStore(tmp_path / "cache")
    store.put(res)
    assert store.install(res.key, root)
    key = prebuild.source_key((root / "model_new.py").read_bytes(), "")
    folder, _info, why = prebuild.workspace_build(root, key)
    assert folder is None and why == "built from other sources or for another GPU"
    folder, info, why = prebuild.workspace_build(root, res.key)
    assert folder is not None and why == "" and info["files"] == 1
    got = prebuild.read_files(folder)
    assert got == [("ext/a.txt", 0o644, 1_000_000_000, b"x")]  # modes and times kept: ninja compares them
    if os.geteuid() == 0:
        os.chmod(root / ".cuda_agent", 0o777)  # a state folder others may write is not believed
        assert prebuild.workspace_build(root, res.key)[2] == ".cuda_agent is writable by other users"


def test_files_sent_back_by_candidate_code_cannot_leave_the_folder():
    import base64

    def rec(path: str) -> dict:
        return {"path": path, "mode": 0o4755, "mtime_ns": 5, "data": base64.b64encode(b"z").decode()}

    got = prebuild.decode([rec("../evil"), rec("/etc/x"), rec("a/./b"), rec("ok/lib.so"), "junk"])
    assert got == [("ok/lib.so", 0o755, 5, b"z")]  # no setuid bit either
    assert prebuild.source_key(b"a", "9.0+PTX") != prebuild.source_key(b"a", "8.0+PTX")


def test_the_build_pools_width_follows_cores_memory_and_gpus():
    """Two cores a build (``build_jobs``) after two per GPU's jobs, one build per 3 GB of host
    memory, at most 8 per GPU: a 16-core host with one GPU keeps its 7 builds, a host with
    8 GPUs is not held to the 8 of one, and little memory narrows the pool."""
    from cuda_agent.sandbox.judge.pipeline import BUILD_MEMORY_BYTES, auto_build_workers

    gib = 1 << 30
    o = JudgeOptions()
    assert auto_build_workers(o, 1, cores=16, memory=128 * gib) == 7
    assert auto_build_workers(o, 8, cores=128, memory=560 * gib) == 56
    assert auto_build_workers(o, 1, cores=64, memory=512 * gib) == 8
    assert auto_build_workers(o, 8, cores=128, memory=30 * gib) == 30 * gib // BUILD_MEMORY_BYTES == 10
    assert auto_build_workers(o, 0, cores=2, memory=24 * gib) == 1
    assert auto_build_workers(o, 4, cores=8, memory=64 * gib) == 1  # no core left: still one build
    assert auto_build_workers(o, 1, cores=16, memory=0) == 7  # memory unknown: the cores decide
    assert auto_build_workers(JudgeOptions(build_jobs=1), 1, cores=16, memory=128 * gib) == 8
    assert auto_build_workers(JudgeOptions(build_workers=3), 8, cores=128, memory=560 * gib) == 3
