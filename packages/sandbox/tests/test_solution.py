"""A solution folder that stands on its own (``best/``), and ``cuda-agent verify`` /
``cuda-agent profile`` re-checking one with no service running (CPU backend)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest

from cuda_agent.core.cli import main
from cuda_agent.core.plugins import get_plugin_manager
from cuda_agent.core.types import Task
from cuda_agent.sandbox.workspace.solution import export_solution
from cuda_agent.sandbox.workspace.workspace import create_workspace

needs_jobs = pytest.mark.skipif(
    importlib.util.find_spec("cuda_agent.sandbox.judge.jobs") is None,
    reason="verification/profiling jobs (cuda_agent.sandbox.judge.jobs) are not installed",
)

MODEL = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
         "        return x * 3.0\n\n\ndef get_inputs():\n    return [torch.randn(256, 256)]\n\n\n"
         "def get_init_inputs():\n    return []\n")
KERNEL = ('#include <cstdint>\nextern "C" void scale(const float* x, float* y, float a, int64_t n) {\n'
          "  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * a;\n}\n")
MODEL_NEW = ("import torch\nimport torch.nn as nn\n\nfrom cuda_agent_runtime import load_kernels\n\n"
             "kernels = load_kernels()\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
             "        x = x.contiguous()\n        out = torch.empty_like(x)\n"
             "        kernels.scale(x, out, FACTOR, x.numel())\n        return out\n")


def _build(src, build_dir):
    return get_plugin_manager().create("compiler", {"name": "gxx"}).build(src, build_dir)


def _solution(tmp_path, factor: str = "3.0"):
    task = Task(id="scale", source="user", code=MODEL)
    ws = create_workspace(task, tmp_path / "workspace", backend="cpu")
    files = {"kernels/scale.cpp": KERNEL, "model_new.py": MODEL_NEW.replace("FACTOR", factor)}
    best = tmp_path / "run" / "best"
    error = export_solution(best, task, files, ws, _build)
    return best, error


def test_best_folder_is_usable_from_a_copy(tmp_path):
    best, error = _solution(tmp_path)
    assert error is None
    meta = json.loads((best / ".cuda_agent" / "workspace.json").read_text())
    assert meta["backend"] == "cpu" and meta["compiler"] == "gxx" and meta["task_id"] == "scale"
    assert "cuda-agent verify" in (best / "README.md").read_text()
    copy = tmp_path / "elsewhere"
    shutil.copytree(best, copy)
    shutil.rmtree(tmp_path / "workspace")  # nothing of the run's workspace is needed
    code = ("import torch, model, model_new\nx = torch.randn(8, 8)\n"
            "print(torch.equal(model.Model()(x), model_new.ModelNew()(x)))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr[-2000:]


def test_a_failed_build_is_reported(tmp_path):
    task = Task(id="scale", source="user", code=MODEL)
    ws = create_workspace(task, tmp_path / "workspace", backend="cpu")
    files = {"kernels/scale.cpp": 'extern "C" void scale(float* y) { y[0] = undeclared; }\n', "model_new.py": MODEL_NEW.replace("FACTOR", "3.0")}
    error = export_solution(tmp_path / "best", task, files, ws, _build)
    assert error and "undeclared" in error, error
    assert not (tmp_path / "best" / ".cuda_agent" / "build" / "manifest.json").exists() or not json.loads(
        (tmp_path / "best" / ".cuda_agent" / "build" / "manifest.json").read_text()).get("ok")


@needs_jobs
def test_profile_and_verify_a_finished_run_with_no_service(tmp_path, capfd):
    best, _ = _solution(tmp_path)
    assert main(["profile", str(tmp_path / "run")]) == 0  # a run folder means its best/
    out = capfd.readouterr().out
    assert "PROFILE: eager" in out and "(reward " in out and f"profile of {best}" in out, out
    wrong = tmp_path / "wrong"
    shutil.copytree(best, wrong)
    (wrong / "model_new.py").write_text(MODEL_NEW.replace("FACTOR", "2.0"))
    assert main(["verify", str(wrong)]) == 1
    out = capfd.readouterr().out
    assert "VERIFY FAILED" in out and f"verify of {wrong}" in out, out
    assert (best / "model_new.py").read_text() == MODEL_NEW.replace("FACTOR", "3.0")  # nothing written there


def test_recheck_reports_bad_folders_in_one_line(tmp_path, capfd):
    assert main(["verify", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capfd.readouterr().err
    (tmp_path / "model_new.py").write_text("x = 1\n")
    assert main(["verify", str(tmp_path)]) == 2
    err = capfd.readouterr().err
    assert "no model.py" in err and len(err.strip().splitlines()) == 1
