import pytest

from cuda_agent.core.types import Task
from cuda_agent.evaluation.solutions import (
    KERNELBENCH,
    WORKSPACE,
    SolutionError,
    install_solution,
    load_solutions,
    match_solutions,
)

KB = "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n"
WS = "from cuda_agent_runtime import load_kernels\nclass ModelNew:\n    pass\n"


def tasks():
    return [
        Task(id="L1/19_ReLU", source="kernelbench", code="", name="19_ReLU", level=1),
        Task(id="L1/1_Square_matmul", source="kernelbench", code="", name="1_Square_matmul", level=1),
        Task(id="L2/1_Conv2D_ReLU", source="kernelbench", code="", name="1_Conv2D_ReLU", level=2),
        Task(id="L3/5_AlexNet", source="kernelbench", code="", name="5_AlexNet", level=3),
    ]


def test_layouts_and_matching(tmp_path):
    root = tmp_path / "sols"
    # workspace form, named by task id with "__"
    ws = root / "L1__19_ReLU"
    (ws / "kernels").mkdir(parents=True)
    (ws / "model_new.py").write_text(WS)
    (ws / "kernels" / "relu.cu").write_text("// cuda")
    (ws / "kernels" / "relu_binding.cpp").write_text("// binding")
    # single file grouped by level, KernelBench file name
    (root / "level2").mkdir()
    (root / "level2" / "1_Conv2D_ReLU.py").write_text(KB)
    # KernelBench's run layout, two samples of one problem
    (root / "level_1_problem_1_sample_0_kernel.py").write_text(KB)
    (root / "level_1_problem_1_sample_1_kernel.py").write_text(KB)
    # a task folder with samples in the single-file form
    (root / "5_AlexNet").mkdir()
    (root / "5_AlexNet" / "a.py").write_text(KB)
    (root / "5_AlexNet" / "notes.py").write_text("x = 1\n")  # no ModelNew: ignored
    # something that matches no task
    (root / "99_Unknown.py").write_text(KB)

    sols = load_solutions(root)
    by_task, unmatched = match_solutions(tasks(), sols)
    assert [s.form for s in by_task["L1/19_ReLU"]] == [WORKSPACE]
    assert sorted(by_task["L1/19_ReLU"][0].files) == ["kernels/relu.cu", "kernels/relu_binding.cpp", "model_new.py"]
    assert [s.sample for s in by_task["L1/1_Square_matmul"]] == ["0", "1"]
    assert by_task["L2/1_Conv2D_ReLU"][0].form == KERNELBENCH
    assert [s.sample for s in by_task["L3/5_AlexNet"]] == ["a"]
    assert [s.key for s in unmatched] == ["99_Unknown"]


def test_plain_model_new_folder_is_single_file_form(tmp_path):
    d = tmp_path / "L1__19_ReLU"
    d.mkdir()
    (d / "model_new.py").write_text(KB)
    (sol,) = load_solutions(tmp_path)
    assert sol.form == KERNELBENCH


def test_install_replaces_template_kernels(tmp_path):
    root = tmp_path / "sols" / "L1__19_ReLU"
    (root / "kernels").mkdir(parents=True)
    (root / "model_new.py").write_text(WS)
    (root / "kernels" / "mine.cu").write_text("// mine")
    (sol,) = load_solutions(tmp_path / "sols")
    ws = tmp_path / "ws"
    (ws / "kernels").mkdir(parents=True)
    (ws / "kernels" / "template.cu").write_text("// template")
    install_solution(sol, ws)
    assert sorted(p.name for p in (ws / "kernels").iterdir()) == ["mine.cu"]
    assert (ws / "model_new.py").read_text() == WS


def test_errors_are_one_line(tmp_path):
    with pytest.raises(SolutionError, match="not found"):
        load_solutions(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SolutionError, match="no solutions"):
        load_solutions(tmp_path / "empty")
