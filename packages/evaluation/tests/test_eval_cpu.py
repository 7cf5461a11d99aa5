"""Scoring a folder of solutions end to end on the CPU backend: real g++ builds, real
verification and profiling jobs in the CPU executor, real reports."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cuda_agent.core.plugins import get_plugin_manager


def _missing() -> str | None:
    pm = get_plugin_manager()
    if "kernelbench" not in pm.components("dataset"):
        return "the kernelbench dataset plugin (cuda-agent-datasets) is not installed"
    if "gxx" not in pm.components("compiler"):
        return "the gxx compiler (cuda-agent-sandbox) is not registered"
    try:
        from cuda_agent.sandbox.judge import jobs  # noqa: F401
    except ImportError:
        return "cuda_agent.sandbox.judge.jobs (verification/profiling jobs) is not available"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")

N = 4096


def task(body: str, init: str = "[]") -> str:
    return textwrap.dedent(
        f"""
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, a, b):
                return {body}


        def get_inputs():
            return [torch.randn({N}), torch.randn({N})]


        def get_init_inputs():
            return {init}
        """
    )


TASKS = {
    "1_Add": task("a + b"),
    "2_Sub": task("a - b"),
    "3_Mul": task("a * b"),
    "4_Max": task("torch.maximum(a, b)"),
    "5_Min": task("torch.minimum(a, b)"),
}

MODEL_NEW = """
import torch
import torch.nn as nn

from cuda_agent_runtime import load_kernels

kernels = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        a = a.contiguous()
        b = b.contiguous()
        out = torch.empty_like(a)
        kernels.{fn}(a, b, out, a.numel())
        return out
"""

KERNEL = """
#include <cstdint>
extern "C" void {fn}(const float* a, const float* b, float* out, int64_t n) {{
  for (int64_t i = 0; i < n; ++i) out[i] = {expr};
}}
"""

FORBIDDEN = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.mul(a, b)
"""


def workspace_solution(root: Path, name: str, fn: str, expr: str, broken: bool = False) -> None:
    d = root / name
    (d / "kernels").mkdir(parents=True)
    (d / "model_new.py").write_text(MODEL_NEW.format(fn=fn))
    src = KERNEL.format(fn=fn, expr=expr)
    if broken:
        src = src.replace("out[i] =", "out[i] = undefined_symbol +")
    (d / "kernels" / f"{fn}.cpp").write_text(src)


@pytest.fixture()
def setup(tmp_path):
    kb = tmp_path / "kb" / "level1"
    kb.mkdir(parents=True)
    for name, code in TASKS.items():
        (kb / f"{name}.py").write_text(code)
    sols = tmp_path / "solutions"
    workspace_solution(sols, "L1__1_Add", "add", "a[i] + b[i]")  # correct
    workspace_solution(sols, "L1__2_Sub", "sub", "a[i] + b[i]")  # wrong result
    (sols / "level1").mkdir()
    (sols / "level1" / "3_Mul.py").write_text(FORBIDDEN)  # KernelBench single-file form, torch op
    workspace_solution(sols, "L1__4_Max", "vmax", "a[i] > b[i] ? a[i] : b[i]", broken=True)  # does not compile
    # 5_Min: no solution
    return tmp_path


def baseline_overrides(tmp: Path) -> list[str]:
    """The overrides of :func:`overrides` that `cuda-agent baselines` reads (it refuses the others)."""
    return [o for o in overrides(tmp) if not o.startswith(("eval.solutions=", "run.", "eval.workers=", "logging."))]


def overrides(tmp: Path) -> list[str]:
    return [
        "eval.dataset.name=kernelbench",
        f"eval.dataset.options.root={tmp / 'kb'}",
        f"eval.solutions={tmp / 'solutions'}",
        "executor.name=cpu",
        "backend=cpu",
        f"run.output_dir={tmp / 'runs'}",
        "eval.workers=2",
        "logging.console=false",
        f"eval.profile.options.baseline_cache_dir={tmp / 'baseline-cache'}",
        "executor.options.recycle=on_error",  # one warm worker serves the jobs (tests only)
    ]


EXPECTED = {
    "L1/1_Add": "none",
    "L1/2_Sub": "wrong_result",
    "L1/3_Mul": "forbidden_op",
    "L1/4_Max": "compile_error",
    "L1/5_Min": "missing",
}


def test_score_folder_on_cpu(setup, capsys):
    from cuda_agent.core.cli import main
    from cuda_agent.core.config import compose
    from cuda_agent.evaluation.evaluate import evaluate

    # baselines first: measured once into the cache, where the profiling job finds them
    assert main(["baselines", *baseline_overrides(setup), "eval.ids=[L1/1_Add]", "eval.progress=false"]) == 0
    out = capsys.readouterr().out
    assert "1 tasks (1 measured now, 0 from the cache, 0 failed)" in out and " spread " in out
    # a noisy record is measured again on request; a steady one stays
    assert main(["baselines", *baseline_overrides(setup), "eval.ids=[L1/1_Add]", "eval.progress=false",
                 "--refresh-spread", "100"]) == 0
    assert "(0 measured now, 1 from the cache" in capsys.readouterr().out
    # a record replaced says why in the table's note
    assert main(["baselines", *baseline_overrides(setup), "eval.ids=[L1/1_Add]", "eval.progress=false",
                 "--refresh-spread", "1e-12"]) == 0
    out = capsys.readouterr().out
    assert "(1 measured now, 0 from the cache" in out and "measured again: refresh: a spread above refresh_spread" in out
    assert main(["baselines", *baseline_overrides(setup), "--refresh-spread", "0"]) != 0
    assert "--refresh-spread must be > 0" in capsys.readouterr().err
    cfg = compose([], overrides(setup) + ["eval.progress=false"])
    out = evaluate(cfg)
    report = out["report"]
    got = {t["task_id"]: t["failure"] for t in report["tasks"]}
    assert got == EXPECTED, json.dumps(report["tasks"], indent=1)[:4000]
    add = next(t for t in report["tasks"] if t["task_id"] == "L1/1_Add")
    assert add["correct"] and add["t_candidate_ms"] > 0 and add["t_eager_ms"] > 0
    assert add["speedup_vs_eager"] is not None and add["speedup_vs_compile"] is not None
    assert add["metadata"]["profile"]["baseline_cache"] == "hit"
    m = report["metrics"]["overall"]
    assert m["n"] == 5 and m["n_correct"] == 1 and m["pass_rate"] == pytest.approx(0.2)
    assert m["failures"]["wrong_result"] == 1 and m["failures"]["forbidden_op"] == 1
    assert m["failures"]["compile_error"] == 1 and m["failures"]["missing"] == 1
    run_dir = Path(out["run_dir"])
    for name in ("results.jsonl", "results.json", "report.md", "report.html", "config.yaml"):
        assert (run_dir / name).exists(), name
    md = (run_dir / "report.md").read_text()
    assert "| **solutions** | 20.0% |" in md
    # 4 of the 5 tasks had a solution: the figures over those beside the all-task ones
    assert m["n_with_solution"] == 4 and m["with_solution"]["n"] == 4
    assert m["with_solution"]["pass_rate"] == pytest.approx(0.25)
    assert "| solutions: the 4 tasks with a solution | 25.0% |" in md
    assert "4 of 5 tasks had a solution; the 1 without one count as failed" in md
    assert "4 of 5 tasks had a solution" in (run_dir / "report.html").read_text()
    assert "| solutions: the 4 tasks with a solution | 25.0% |" in out["summary"]
    env = report["environment"]
    assert env["backend"] == "cpu"
    assert env["profiler"] != "unknown" and env["precision"] != "unknown"
    # --only-covered: of the two tasks asked for, only the one with a solution is scored
    capsys.readouterr()
    assert main(["eval", *overrides(setup), "eval.progress=false", "--ids", "L1/1_Add,L1/5_Min",
                 "--only-covered"]) == 0
    printed = capsys.readouterr().out
    assert "--only-covered: 1 of the 2 selected tasks have a solution" in printed
    [covered_run] = [p for p in (setup / "runs").iterdir() if p != run_dir and (p / "results.json").exists()]
    rep = json.loads((covered_run / "results.json").read_text())
    assert [t["task_id"] for t in rep["tasks"]] == ["L1/1_Add"] and rep["tasks"][0]["correct"]
    assert "with_solution" not in rep["metrics"]["overall"] and "| **solutions** | 100.0% |" in printed
    assert main(["eval", *overrides(setup), "--ids", "L1/5_Min", "--only-covered"]) == 2
    assert "none of the 1 selected tasks has a solution" in capsys.readouterr().err


SLOW_SUB = """
#include <chrono>
#include <cstdint>
#include <thread>
extern "C" void sub(const float* a, const float* b, float* out, int64_t n) {
  std::this_thread::sleep_for(std::chrono::seconds(4));
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}
"""


def _sigint_as_in_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_cli_resume_after_kill(setup):
    env = dict(os.environ, CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD="1")
    # the second task's kernel (still a wrong result) takes seconds per call, so the run is
    # certainly interrupted after the first row and before the last: the other refusals
    # take milliseconds once the first task's build is done
    (setup / "solutions" / "L1__2_Sub" / "kernels" / "sub.cpp").write_text(SLOW_SUB)
    # no baselines: this test is about resuming, not timing
    cmd = [sys.executable, "-m", "cuda_agent.core.cli", "eval", *overrides(setup), "eval.workers=1",
           "eval.profile.options.baselines=false"]
    # Ctrl-C as a user's terminal delivers it: a library used by an earlier test in this process
    # may have left SIGINT ignored or blocked, and a child inherits both
    inherited = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                            preexec_fn=_sigint_as_in_a_terminal)
    runs = setup / "runs"
    deadline = time.time() + 120
    results = None
    while time.time() < deadline:
        found = list(runs.glob("*/results.jsonl"))
        if found and found[0].read_text().count("\n") >= 1:
            results = found[0]
            break
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    started = time.time()
    seen = results.read_text() if results is not None else ""
    proc.send_signal(signal.SIGINT)  # Ctrl-C: the run stops, keeping what is finished
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert results is not None, err[-3000:]
    why = (f"test process's SIGINT handler and blocked signals {inherited}; SIGINT sent with {seen.count(chr(10))} row(s) written ({seen[:200]!r}); the process ended "
           f"{time.time() - started:.1f} s later with {results.read_text().count(chr(10))} rows; stderr: {err[-3000:]}")
    assert proc.returncode == 130, why
    assert "continue with: cuda-agent eval --resume" in err
    first = [json.loads(x)["task_id"] for x in results.read_text().splitlines() if x.strip().endswith("}")]
    assert 1 <= len(first) < 5
    run_dir = results.parent
    # the run folder's saved config is enough to continue
    res = subprocess.run(
        [sys.executable, "-m", "cuda_agent.core.cli", "eval", "--resume", str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [json.loads(x) for x in results.read_text().splitlines() if x.strip().endswith("}")]
    ids = [x["task_id"] for x in lines]
    assert sorted(set(ids)) == sorted(EXPECTED)
    assert len(ids) == len(set(ids)), f"a finished task was scored again: {ids}"
    assert {x["task_id"]: x["failure"] for x in lines} == EXPECTED
    # samples.jsonl: one row per solution, none twice, each in the batch its task row names
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert sorted(x["task_id"] for x in samples) == sorted(t for t in EXPECTED if t != "L1/5_Min")
    batches = {x["task_id"]: x["metadata"].get("sample_batch") for x in lines}
    assert all(x["batch"] == batches[x["task_id"]] for x in samples)
    rules = {x["task_id"]: x["rule"] for x in samples}
    assert (rules["L1/1_Add"], rules["L1/2_Sub"], rules["L1/4_Max"]) == (None, "wrong_result", "compile_error")
    assert rules["L1/3_Mul"] not in (None, "forbidden_op"), samples  # the judge named the rule that refused torch.mul
    assert "faster than compile" in res.stdout and (run_dir / "report.html").exists()
    # the reported wall time covers both sessions: the interrupted one counts too
    info = json.loads((run_dir / "results.json").read_text())["info"]
    assert info["wall_seconds"] > info["wall_seconds_this_session"] > 0


def test_agent_episode_scored_by_its_best_candidate(setup):
    """`cuda-agent eval` with a policy: an episode on the CPU backend, driven by a scripted
    OpenAI-compatible server on loopback, writes a kernel, verifies it and is scored."""
    from cuda_agent.core.agent.testing import ScriptedChatServer, reply, tool_call
    from cuda_agent.core.config import compose
    from cuda_agent.evaluation.evaluate import evaluate

    kernel = KERNEL.format(fn="add", expr="a[i] + b[i]")
    script = [
        reply("", [tool_call("read", {"path": "model_new.py"})]),
        reply("", [tool_call("write", {"path": "kernels/add.cpp", "content": kernel}),
                   tool_call("write", {"path": "model_new.py", "content": MODEL_NEW.format(fn="add")})]),
        reply("", [tool_call("bash", {"command": "python tools/verify.py"})]),
        reply("Verified.\nDONE"),
    ]
    with ScriptedChatServer(script) as server:
        cfg = compose([], [
            "eval.dataset.name=kernelbench",
            f"eval.dataset.options.root={setup / 'kb'}",
            "eval.ids=[L1/1_Add]",
            "policy.name=openai",
            "policy.options.model=scripted",
            f"policy.options.base_url={server.base_url}",
            "policy.options.backoff=0.01",
            "executor.name=cpu",
            "backend=cpu",
            f"run.output_dir={setup / 'runs'}",
            "eval.progress=false",
            "eval.profile.options.baselines=false",
            "logging.console=false",
        ])
        out = evaluate(cfg)
    (task,) = out["report"]["tasks"]
    assert task["task_id"] == "L1/1_Add" and task["correct"], task
    assert task["metadata"]["finish_reasons"] == ["done"]
    assert task["t_candidate_ms"] > 0
    assert out["report"]["info"]["mode"] == "agent" and out["report"]["info"]["label"] == "openai"
    traj = [json.loads(x) for x in (Path(out["run_dir"]) / "trajectories.jsonl").read_text().splitlines()]
    assert len(traj) == 1 and traj[0]["task_id"] == "L1/1_Add"
    # the attempt is the sample; its verified candidate is a row naming the trajectory
    (sample,) = [json.loads(x) for x in (Path(out["run_dir"]) / "samples.jsonl").read_text().splitlines()]
    assert (sample["sample"], sample["index"], sample["candidate"]) == ("a0", 0, 0) and sample["correct"]
    assert sample["trajectory"] == traj[0]["id"] and sample["source"] == task["source"]
    assert out["report"]["metrics"]["overall"]["pass_at_k"] == {"1": 1.0}


# a task with three samples: one correct, one wrong result, one refused by a static rule
REFERENCE_IMPORT = "from model import Model  # noqa: F401 (the reference: refused before anything runs)\n"


@pytest.fixture()
def three_samples(tmp_path):
    kb = tmp_path / "kb" / "level1"
    kb.mkdir(parents=True)
    (kb / "1_Add.py").write_text(TASKS["1_Add"])
    task_dir = tmp_path / "solutions" / "L1__1_Add"
    workspace_solution(task_dir, "s1", "add", "a[i] + b[i]")  # correct
    workspace_solution(task_dir, "s2", "add", "a[i] - b[i]")  # wrong result
    workspace_solution(task_dir, "s3", "add", "a[i] + b[i]")  # correct kernel, refused statically
    main = task_dir / "s3" / "model_new.py"
    main.write_text(REFERENCE_IMPORT + main.read_text())
    return tmp_path


def test_every_sample_kept_with_its_rule_and_pass_at_k(three_samples, capsys):
    from cuda_agent.core.cli import main
    from cuda_agent.evaluation.samples import pass_at_k

    ov = overrides(three_samples) + ["eval.progress=false", "eval.workers=1", "eval.profile.options.baselines=false"]
    assert main(["eval", *ov]) == 0
    out = capsys.readouterr().out
    assert "3 samples of 1 tasks: pass@1 33.3%, pass@2 66.7%" in out, out[-3000:]
    (run_dir,) = (three_samples / "runs").iterdir()
    rows = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [r["sample"] for r in rows] == ["s1", "s2", "s3"] and [r["index"] for r in rows] == [0, 1, 2]
    s1, s2, s3 = rows
    assert s1["correct"] and s1["failure"] == "none" and s1["rule"] is None and s1["t_candidate_ms"] > 0
    assert s2["failure"] == "wrong_result" and s2["rule"] == "wrong_result" and s2["message"], s2
    assert s3["failure"] == "forbidden_op" and s3["rule"] == "static.reference-model", s3
    assert "(rule static.reference-model:" in s3["message"] and "model_new.py:1" in s3["message"]
    assert all(r["source"].endswith(r["sample"]) for r in rows)
    assert all(set(r) >= {"weights", "rule_profile", "t_eager_ms", "t_compile_ms", "speedup_vs_compile"} for r in rows)
    (task_row,) = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    # the task row keeps the best sample and names the batch of its samples
    assert task_row["correct"] and task_row["source"] == s1["source"] and task_row["candidates"] == 3
    assert task_row["metadata"]["sample_batch"] == s1["batch"] == s2["batch"] == s3["batch"]
    assert task_row["metadata"]["candidate_failures"] == ["none", "wrong_result", "forbidden_op"]
    # pass@k by hand: n = 3 samples, c = 1 correct; pass@2 = 1 - C(2,2)/C(3,2) = 1 - 1/3
    assert pass_at_k(3, 1, 1) == pytest.approx(1 / 3) and pass_at_k(3, 1, 2) == pytest.approx(2 / 3)
    report = json.loads((run_dir / "results.json").read_text())
    for group in ("L1", "overall"):
        m = report["metrics"][group]
        assert m["pass_at_k"] == pytest.approx({"1": 1 / 3, "2": 2 / 3}) and m["n_samples"] == 3
        assert m["pass_rate"] == 1.0  # the task passes: its best sample is correct
    refusals = {e["rule"]: e for e in report["refusals"]}
    assert sorted(refusals) == ["static.reference-model", "wrong_result"]
    assert all(e["count"] == 1 and e["share"] == pytest.approx(1 / 3) and e["tasks"] == ["L1/1_Add"]
               for e in refusals.values())
    assert refusals["static.reference-model"]["category"] == "forbidden_op"
    assert refusals["static.reference-model"]["example"] == s3["message"].splitlines()[0][:300]
    md = (run_dir / "report.md").read_text()
    assert "| level | tasks | samples | pass@1 | pass@2 |" in md and "| overall | 1 | 3 | 33.3% | 66.7% |" in md
    assert "| static.reference-model | forbidden op | 1 | 33.3% | L1/1_Add |" in md
    assert "| wrong_result | wrong result | 1 | 33.3% | L1/1_Add |" in md
    html = (run_dir / "report.html").read_text()
    assert html.count('class="refusal-bar"') == 2 and 'data-rule="static.reference-model"' in html
    assert len(re.findall(r'<tr class="sample( best)?"', html)) == 3 and html.count('<tr class="sample best"') == 1
    assert "<summary>3 sample row(s): 1 correct, 1 wrong result, 1 forbidden op</summary>" in html
    # re-rendering from the run folder reads the same samples
    before = report["metrics"]["overall"]["pass_at_k"], report["refusals"]
    assert main(["eval", "--resume", str(run_dir), "--report-only"]) == 0
    again = json.loads((run_dir / "results.json").read_text())
    assert (again["metrics"]["overall"]["pass_at_k"], again["refusals"]) == before
