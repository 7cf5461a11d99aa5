import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from cuda_agent.core.cli import main
from cuda_agent.core.hookspecs import hookimpl
from cuda_agent.core.interfaces import Dataset
from cuda_agent.core.plugins import get_plugin_manager
from cuda_agent.core.types import Task
from cuda_agent.evaluation.metrics import TaskResult
from cuda_agent.evaluation.runner import ResultStore
from cuda_agent.evaluation.scoring import select_tasks


@dataclass
class TinyOptions:
    n: int = 6


class TinyDataset(Dataset):
    name = "evaltest-tiny"
    description = "six tasks over two levels (tests)"
    Options = TinyOptions

    def tasks(self):
        for i in range(self.options.n):
            level = 1 + i % 2
            yield Task(id=f"L{level}/{i}_t", source="test", code="x = 1\n", name=f"{i}_t", level=level)


@pytest.fixture()
def tiny_plugin():
    pm = get_plugin_manager()
    plugin = SimpleNamespace(register_datasets=hookimpl(lambda register: register(TinyDataset)))
    pm.register(plugin, "evaltest")
    yield pm
    pm.unregister("evaltest")


def test_select_tasks():
    tasks = [Task(id=f"L{1 + i % 2}/{i}_t", source="t", code="", level=1 + i % 2) for i in range(10)]
    assert [t.id for t in select_tasks(tasks, levels=[2])] == ["L2/1_t", "L2/3_t", "L2/5_t", "L2/7_t", "L2/9_t"]
    assert [t.id for t in select_tasks(tasks, ids=["L1/*"], limit=2)] == ["L1/0_t", "L1/2_t"]
    shards = [select_tasks(tasks, shard=f"{i}/3") for i in range(3)]
    assert sorted(t.id for s in shards for t in s) == sorted(t.id for t in tasks)
    assert [t.id for t in shards[1]] == ["L2/1_t", "L1/4_t", "L2/7_t"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--shard", "3/2"], "eval.shard"),
        (["--levels", "x"], "--levels takes numbers"),
        (["--report-only"], "--report-only needs --resume"),
        (["--ids", "nope"], "no tasks selected"),
        (["policy.name=null"], "nothing to evaluate"),
        (["--solutions", "/nonexistent/solutions"], "solutions folder not found"),
        (["eval.dataset.name=evaltest-tinyy"], "did you mean 'evaltest-tiny'"),
    ],
)
def test_one_line_errors(tiny_plugin, tmp_path, capsys, args, message):
    base = ["eval.dataset.name=evaltest-tiny", f"run.output_dir={tmp_path / 'runs'}"]
    if args and "=" in args[0]:
        base = (base if args[0].startswith("policy.") else [f"run.output_dir={tmp_path / 'runs'}"]) + [args[0]]
        args = []
    code = main(["eval", *base, *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # no run folder for bad input


def test_report_only_rerenders(tmp_path, capsys):
    run = tmp_path / "run"
    store = ResultStore(run / "results.jsonl")
    store.append(TaskResult("L1/1_a", 1, correct=True, failure="none", t_candidate_ms=1, t_eager_ms=2, t_compile_ms=3,
                            speedup_vs_eager=2.0, speedup_vs_compile=3.0))
    store.append(TaskResult("L1/2_b", 1, correct=False, failure="timeout"))
    (run / "results.json").write_text(json.dumps({"info": {"title": "earlier", "label": "mine"}, "environment": {"gpu": "G"}}))
    assert main(["eval", "--resume", str(run), "--report-only"]) == 0
    md = (run / "report.md").read_text()
    assert md.startswith("# earlier")
    assert "| **mine** | 50.0% | 50.0% | 50.0% | 2.00x | 3.00x |" in md
    assert "| GPU | G |" in md
    assert (run / "report.html").exists()
    assert "pass@k" not in md  # a run from before samples.jsonl: no sample sections
