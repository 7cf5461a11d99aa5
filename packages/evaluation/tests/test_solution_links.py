"""Links in a solutions folder are refused, never followed (rule judge.files), and nothing a
link points to reaches a record; ordinary folders beside them load and pass."""

import json
import os
import stat
import textwrap
from pathlib import Path

import pytest

from cuda_agent.evaluation.solutions import RULE_FILES, install_solution, load_solutions, load_workspace_solution

SECRET = "TOPSECRET-solution-5d1c"
MODEL_NEW = "import torch\nimport torch.nn as nn\nfrom cuda_agent_runtime import load_kernels\n\nclass ModelNew(nn.Module):\n    pass\n"
KERNEL = '#include <cstdint>\nextern "C" void add(const float* a, const float* b, float* o, int64_t n) {}\n'


@pytest.fixture()
def secret(tmp_path):
    p = tmp_path / "private" / "secret.txt"
    p.parent.mkdir()
    p.write_text(SECRET + "\n")
    os.chmod(p, 0o600)
    return p


def honest(d: Path) -> Path:
    (d / "kernels").mkdir(parents=True)
    (d / "model_new.py").write_text(MODEL_NEW)
    (d / "kernels" / "add.cpp").write_text(KERNEL)
    (d / "kernels" / "local.h").write_text("#pragma once\n")
    return d


def refused_text(sol) -> str:
    return "\n".join(sol.refused)


def test_honest_folder_loads(tmp_path):
    sol = load_workspace_solution(honest(tmp_path / "ok"), "ok")
    assert not sol.refused and sol.form == "workspace"
    assert set(sol.files) == {"model_new.py", "kernels/add.cpp", "kernels/local.h"}


@pytest.mark.parametrize("where", ["kernels/x.cpp", "model_new.py"])
def test_symlink_refused(tmp_path, secret, where):
    d = honest(tmp_path / "sol")
    if (d / where).exists():
        (d / where).unlink()
    (d / where).symlink_to(secret)
    sol = load_workspace_solution(d, "sol")
    text = refused_text(sol)
    assert f"rule {RULE_FILES}" in text and where in text and "symbolic link" in text and str(secret) in text, text
    assert f"replace {where} with the file itself" in text
    assert SECRET not in json.dumps(sol.files) + text


def test_hard_link_refused(tmp_path, secret):
    d = honest(tmp_path / "sol")
    os.link(secret, d / "kernels" / "x.cpp")
    sol = load_workspace_solution(d, "sol")
    text = refused_text(sol)
    assert f"rule {RULE_FILES}" in text and "hard links" in text and "kernels/x.cpp" in text, text
    assert SECRET not in json.dumps(sol.files)


def test_hard_link_to_shadow_refused(tmp_path):
    d = honest(tmp_path / "sol")
    try:
        os.link("/etc/shadow", d / "kernels" / "x.cpp")
    except OSError as exc:
        pytest.skip(f"no hard link to /etc/shadow here: {exc.strerror}")
    sol = load_workspace_solution(d, "sol")
    assert f"rule {RULE_FILES}" in refused_text(sol) and "kernels/x.cpp" not in sol.files


def test_linked_kernels_folder_and_task_folder_and_single_file(tmp_path, secret):
    """A kernels/ that is a link, a task folder that is a link, a single file that is a link:
    each a refused solution of its own; the honest ones beside them load."""
    root = tmp_path / "solutions"
    honest(root / "1_Add")
    d = root / "2_Sub"
    d.mkdir(parents=True)
    (d / "model_new.py").write_text(MODEL_NEW)
    outside = honest(tmp_path / "elsewhere")
    (outside / "kernels" / "y.cpp").symlink_to(secret)
    (d / "kernels").symlink_to(outside / "kernels")
    (root / "3_Mul").symlink_to(outside)
    (root / "level1").mkdir()
    (root / "level1" / "4_Max.py").symlink_to(secret)
    (root / "level1" / "5_Min.py").write_text("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
    sols = {s.key: s for s in load_solutions(root)}
    assert set(sols) == {"1_Add", "2_Sub", "3_Mul", "4_Max", "5_Min"}
    assert not sols["1_Add"].refused and not sols["5_Min"].refused
    for key, what in (("2_Sub", "kernels"), ("3_Mul", "3_Mul"), ("4_Max", "4_Max.py")):
        text = refused_text(sols[key])
        assert f"rule {RULE_FILES}" in text and what in text and "symbolic link" in text, (key, text)
        assert not any(k.startswith("kernels/") for k in sols[key].files) and SECRET not in text
    # a single-file path given directly
    single = load_solutions(root / "level1" / "4_Max.py")
    assert single[0].refused and not single[0].files


def test_install_writes_no_link(tmp_path, secret):
    """install_solution writes through no link of the workspace it fills: a link in the way
    is removed (the link itself), the file written in its place."""
    sol = load_workspace_solution(honest(tmp_path / "sol"), "sol")
    ws = tmp_path / "ws"
    (ws / "kernels").mkdir(parents=True)
    (ws / "kernels" / "add.cpp").symlink_to(secret)
    assert sorted(install_solution(sol, ws)) == ["kernels/add.cpp", "kernels/local.h", "model_new.py"]
    assert stat.S_ISREG(os.lstat(ws / "kernels" / "add.cpp").st_mode)
    assert (ws / "kernels" / "add.cpp").read_text() == KERNEL
    assert secret.read_text() == SECRET + "\n"
    ws2 = tmp_path / "ws2"
    ws2.mkdir()
    (ws2 / "kernels").symlink_to(tmp_path / "private")
    with pytest.raises(Exception, match="symbolic link"):
        install_solution(sol, ws2)
    assert sorted(os.listdir(tmp_path / "private")) == ["secret.txt"]


# --- end to end: cuda-agent eval --solutions on the CPU backend -----------------------------

TASK = textwrap.dedent("""
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, a, b):
            return a + b

    def get_inputs():
        return [torch.randn(4096), torch.randn(4096)]

    def get_init_inputs():
        return []
""")

RUN_MODEL_NEW = textwrap.dedent("""
    import torch
    import torch.nn as nn
    from cuda_agent_runtime import load_kernels

    kernels = load_kernels()

    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, a, b):
            a, b = a.contiguous(), b.contiguous()
            out = torch.empty_like(a)
            kernels.add(a, b, out, a.numel())
            return out
""")

RUN_KERNEL = ('#include <cstdint>\n#include "local.h"\nextern "C" void add(const float* a, const float* b, float* o, '
              'int64_t n) {\n  for (int64_t i = 0; i < n; ++i) o[i] = a[i] + b[i];\n}\n')


def test_scoring_refuses_linked_solutions_and_passes_the_honest_twin(tmp_path, secret):
    """The eval path (SolutionScorer, the judge's real build and verification on the CPU
    backend): the honest twin is correct; the linked ones fail with the rule, and no record
    of any of them holds a line of what a link points to."""
    import dataclasses

    from cuda_agent.core.types import Task
    from cuda_agent.evaluation.scoring import ScoringOptions, SolutionScorer
    from cuda_agent.sandbox.executors.local import CpuExecutor, CpuExecutorOptions

    sols = tmp_path / "solutions"
    for name in ("1_Add", "2_Add"):
        d = sols / name
        (d / "kernels").mkdir(parents=True)
        (d / "model_new.py").write_text(RUN_MODEL_NEW)
        (d / "kernels" / "add.cpp").write_text(RUN_KERNEL)
        (d / "kernels" / "local.h").write_text("#pragma once\n")
    (sols / "2_Add" / "kernels" / "x.cpp").symlink_to(secret)  # the attack: a link beside honest files
    d3 = sols / "3_Add"
    (d3 / "kernels").mkdir(parents=True)
    (d3 / "model_new.py").symlink_to(secret)
    (d3 / "kernels" / "add.cpp").write_text(RUN_KERNEL)
    found = {s.key: s for s in load_solutions(sols)}
    tasks = [Task(id=k, source="test", code=TASK, name=k) for k in sorted(found)]
    executor = CpuExecutor(CpuExecutorOptions(recycle="on_error", spares=0))
    try:
        scorer = SolutionScorer(executor, {k: [v] for k, v in found.items()},
                                ScoringOptions(backend="cpu", work_dir=str(tmp_path / "ws"), profile=False))
        results = {t.id: scorer.score(t) for t in tasks}
    finally:
        executor.close()
    assert results["1_Add"].correct, results["1_Add"].message
    for tid, what in (("2_Add", "kernels/x.cpp"), ("3_Add", "model_new.py")):
        r = results[tid]
        assert not r.correct and r.failure == "compile_error", r
        assert f"rule {RULE_FILES}" in r.message and what in r.message, r.message
    records = json.dumps([dataclasses.asdict(r) for r in results.values()], default=str)
    assert SECRET not in records
