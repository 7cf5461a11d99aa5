"""Workspaces made from the repository template (tools/template, skills/)."""

from __future__ import annotations

import os
import stat

import pytest

from cuda_agent.core.errors import TaskError
from cuda_agent.core.types import Task
from cuda_agent.sandbox.workspace.workspace import Workspace, WorkspaceError, create_workspace, remove_workspace

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(16, 16)]

def get_init_inputs():
    return []
"""


def task(code: str = TASK) -> Task:
    return Task(id="relu", source="test", code=code)


@pytest.mark.parametrize("backend,compiler", [("cuda", None), ("cuda", "nvcc"), ("cpu", None)])
def test_layout(tmp_path, backend, compiler):
    ws = create_workspace(task(), tmp_path / "ws", backend=backend, compiler=compiler)
    r = ws.root
    assert ws.compiler == (compiler or {"cuda": "cpp_extension", "cpu": "gxx"}[backend])
    assert (r / "model.py").read_text() == TASK
    for rel in ("model_new.py", "cuda_agent_runtime.py", "SKILL.md", "tools/compile.py", "tools/verify.py",
                "tools/profile.py", "examples/model_new.py", ".cuda_agent/build", ".cuda_agent/workspace.json"):
        assert (r / rel).exists(), rel
    assert (r / "kernels").is_dir() and not list((r / "kernels").iterdir())
    skill = (r / "SKILL.md").read_text()
    assert "{{" not in skill and "Reward" in skill
    if ws.compiler == "cpp_extension":
        assert (r / "binding_registry.h").exists() and "binding.cpp" in ws.protected
        assert "REGISTER_BINDING" in skill
    elif ws.compiler == "nvcc":
        assert not (r / "binding.cpp").exists() and 'extern "C"' in skill
    else:
        assert "OpenMP" in skill or "openmp" in skill
    for rel in ("model.py", "SKILL.md", "tools", "cuda_agent_runtime.py", "examples"):
        assert rel in ws.protected
        assert not (r / rel).stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    assert Workspace.open(r) == ws
    remove_workspace(r)
    assert not r.exists()


def test_snapshot_restore(tmp_path):
    ws = create_workspace(task(), tmp_path / "ws", backend="cpu")
    (ws.root / "kernels" / "a.cpp").write_text("A")
    (ws.root / "kernels" / "sub").mkdir()
    (ws.root / "kernels" / "sub" / "b.h").write_text("B")
    (ws.root / "model_new.py").write_text("NEW")
    (ws.root / "scratch.py").write_text("not the agent's deliverable")
    snap = ws.snapshot()
    assert snap == {"model_new.py": "NEW", "kernels/a.cpp": "A", "kernels/sub/b.h": "B"}
    (ws.root / "kernels" / "c.cpp").write_text("C")
    (ws.root / "model_new.py").write_text("CHANGED")
    ws.restore(snap)
    assert ws.snapshot() == snap
    with pytest.raises(WorkspaceError, match="not an agent file"):
        ws.restore({"model.py": "hack"})
    with pytest.raises(WorkspaceError, match="not an agent file"):
        ws.restore({"kernels/../model.py": "hack"})
    assert (ws.root / "model.py").read_text() == TASK


def test_snapshot_skips_links_out(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    ws = create_workspace(task(), tmp_path / "ws", backend="cpu")
    os.symlink(secret, ws.root / "kernels" / "x.cpp")
    assert "kernels/x.cpp" not in ws.snapshot()


def test_check_path(tmp_path):
    ws = create_workspace(task(), tmp_path / "ws", backend="cuda")
    assert ws.check_path("kernels/k.cu", write=True) is None
    assert ws.check_path("model_new.py", write=True) is None
    assert "read-only" in ws.check_path("model.py", write=True)
    assert "read-only" in ws.check_path("tools/verify.py", write=True)
    assert "read-only" in ws.check_path(str(ws.root / "binding_registry.h"), write=True)
    assert ws.check_path("model.py") is None  # reading is fine
    assert "outside" in ws.check_path("../other/model.py")
    assert "outside" in ws.check_path("/etc/passwd")
    assert ".cuda_agent" in ws.check_path(".cuda_agent/build/manifest.json")


def test_bad_input(tmp_path):
    with pytest.raises(TaskError, match="syntax error"):
        create_workspace(task("def f(:\n"), tmp_path / "a")
    with pytest.raises(TaskError, match="get_init_inputs"):
        create_workspace(task("class Model: pass\ndef get_inputs(): return []\n"), tmp_path / "b")
    with pytest.raises(WorkspaceError, match="backend"):
        create_workspace(task(), tmp_path / "c", backend="tpu")
    with pytest.raises(WorkspaceError, match="builds for backend"):
        create_workspace(task(), tmp_path / "d", backend="cpu", compiler="nvcc")
    create_workspace(task(), tmp_path / "e")
    with pytest.raises(WorkspaceError, match="not empty"):
        create_workspace(task(), tmp_path / "e")
    create_workspace(task(), tmp_path / "e", overwrite=True)
