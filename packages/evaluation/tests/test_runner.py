import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cuda_agent.core.types import Task
from cuda_agent.evaluation.metrics import TaskResult
from cuda_agent.evaluation.runner import ResultStore, run_tasks


def tasks(n):
    return [Task(id=f"L1/{i}_t", source="test", code="", level=1) for i in range(1, n + 1)]


def test_runs_in_parallel_and_skips_finished(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    calls = []

    def score(task):
        calls.append(task.id)
        time.sleep(0.05)
        return TaskResult(task.id, task.level, correct=True, failure="none", speedup_vs_compile=1.0)

    out = run_tasks(tasks(6), score, store, workers=3, progress=False)
    assert [r.task_id for r in out] == [t.id for t in tasks(6)]
    assert sorted(calls) == sorted(t.id for t in tasks(6))
    calls.clear()
    out = run_tasks(tasks(8), score, store, workers=3, progress=False)
    assert sorted(calls) == ["L1/7_t", "L1/8_t"]  # the first six were not redone
    assert len(out) == 8


def test_harness_error_recorded_and_retried(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")

    def broken(task):
        raise RuntimeError("executor went away")

    out = run_tasks(tasks(2), broken, store, workers=2, progress=False)
    assert all(r.failure == "crash" and "executor went away" in r.message for r in out)
    assert store.finished() == {}  # harness errors do not count as finished
    out = run_tasks(tasks(2), lambda t: TaskResult(t.id, 1, correct=True, failure="none"), store, progress=False)
    assert all(r.correct for r in out)


def test_store_tolerates_a_line_cut_short(tmp_path):
    p = tmp_path / "results.jsonl"
    store = ResultStore(p)
    store.append(TaskResult("a", correct=True, failure="none"))
    with open(p, "a") as f:
        f.write('{"task_id": "b", "corr')  # killed mid-write
    assert list(store.load()) == ["a"]
    store.append(TaskResult("c"))
    assert sorted(store.load()) == ["a", "c"]


SCRIPT = """
import sys, time
from pathlib import Path
from cuda_agent.core.types import Task
from cuda_agent.evaluation.metrics import TaskResult
from cuda_agent.evaluation.runner import ResultStore, run_tasks

out = Path(sys.argv[1])
tasks = [Task(id=f"L1/{i}_t", source="test", code="", level=1) for i in range(1, 13)]

def score(task):
    with open(out / "calls.txt", "a") as f:
        f.write(task.id + "\\n")
    time.sleep(0.25)
    return TaskResult(task.id, 1, correct=True, failure="none", speedup_vs_compile=1.0)

run_tasks(tasks, score, ResultStore(out / "results.jsonl"), workers=2, progress=True)
print("complete")
"""


def _calls(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_resume_after_kill(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stderr=subprocess.PIPE, text=True)
    store = ResultStore(tmp_path / "results.jsonl")
    deadline = time.time() + 60
    while len(store.load()) < 4 and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    first = store.load()
    assert 4 <= len(first) < 12, "killed mid-run"
    first_calls = _calls(tmp_path / "calls.txt")
    res = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "complete" in res.stdout, res.stderr[-2000:]
    # the progress bar shows the finished count and an ETA
    assert "task" in res.stderr and "<" in res.stderr
    second_calls = _calls(tmp_path / "calls.txt")[len(first_calls):]
    assert not set(second_calls) & set(first), "a finished task was scored again"
    assert sorted(store.load()) == sorted(f"L1/{i}_t" for i in range(1, 13))
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines() if x.strip()]
    assert len({x["task_id"] for x in lines}) == 12
