"""``cuda-agent optimize`` and ``cuda-agent demo`` end to end on the CPU backend."""

from __future__ import annotations

import importlib.util
import json

import pytest

from cuda_agent.core.agent import TrajectoryStore
from cuda_agent.core.agent.testing import ScriptedChatServer, reply, tool_call
from cuda_agent.core.cli import main

needs_jobs = pytest.mark.skipif(
    importlib.util.find_spec("cuda_agent.sandbox.judge.jobs") is None,
    reason="verification/profiling jobs (cuda_agent.sandbox.judge.jobs) are not installed",
)


@needs_jobs
def test_demo_ends_with_a_verified_speedup(tmp_path, capfd):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out)]) == 0
    captured = capfd.readouterr()
    printed = captured.out
    progress = [ln for ln in captured.err.splitlines() if ln.startswith("turn ")]
    rep = json.loads((out / "report.json").read_text())
    assert rep["verified"] and rep["finish_reason"] == "done"
    assert rep["speedup_vs_eager"] is not None and rep["speedup_vs_compile"] is not None
    assert rep["reward"]["correct"]
    assert "verified:" in printed and str(out / "report.md") in printed
    assert (out / "best" / "model_new.py").exists() and (out / "best" / "kernels" / "running_sum.cpp").exists()
    assert (out / "best" / "model.py").exists() and (out / "best" / ".cuda_agent" / "build" / "manifest.json").exists()
    report_md = (out / "report.md").read_text()
    assert f"cuda-agent verify {out / 'best'}" in report_md and f"cuda-agent profile {out / 'best'}" in report_md
    assert "python tools/verify.py" not in report_md and "Spread: " in report_md
    assert f"re-check: cuda-agent verify {out / 'best'}" in printed
    assert (f"**Verified solution: {rep['speedup_vs_eager']:.2f}x faster than eager PyTorch, "
            f"{rep['speedup_vs_compile']:.2f}x against torch.compile.**") in (out / "report.md").read_text()
    transcript = (out / "transcript.md").read_text()
    assert "python tools/profile.py" in transcript and "## Candidates" in transcript
    # the progress line numbers turns as the transcript and the report do
    last = int(progress[-1].split()[1])
    assert f"## Turn {last} " in transcript and f"## Turn {last + 1} " not in transcript
    assert f"turn {rep['best_turn']} (" in "\n".join(progress) and f"best version | turn {rep['best_turn']}:" in report_md
    # the profile after a verification of the same files ran its timing: only the verdict was reused
    assert "that verdict reused, the timing ran now" in transcript
    assert "(files unchanged since the last run: result reused)" not in transcript
    [traj] = list(TrajectoryStore(out / "trajectories.jsonl"))
    assert traj.best is not None and traj.reward.value >= 1
    errors = [r.content[:300] for t in traj.turns for r in t.tool_results if not r.ok]
    assert traj.metadata["tool_calls"] == 9 and traj.metadata["tool_errors"] == len(errors) == 0, errors
    capfd.readouterr()
    assert main(["transcript", str(out / "trajectories.jsonl")]) == 0
    assert capfd.readouterr().out == transcript
    assert (out / "config.yaml").exists() and (out / "log.jsonl").exists()


@needs_jobs
def test_optimize_with_an_openai_endpoint(tmp_path, capfd):
    model = tmp_path / "scale.py"
    model.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return x * 3.0\n\n\ndef get_inputs():\n    return [torch.randn(64, 64)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    kernel = ('#include <cstdint>\nextern "C" void scale3(const float* x, float* y, int64_t n) {\n'
              "  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 3.0f;\n}\n")
    model_new = ("import torch\nimport torch.nn as nn\n\nfrom cuda_agent_runtime import load_kernels\n\n"
                 "kernels = load_kernels()\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
                 "        x = x.contiguous()\n        out = torch.empty_like(x)\n"
                 "        kernels.scale3(x, out, x.numel())\n        return out\n")
    script = [
        reply("", [tool_call("read", {"path": "model_new.py"})]),
        reply("", [tool_call("write", {"path": "kernels/s.cpp", "content": kernel}),
                   tool_call("write", {"path": "model_new.py", "content": model_new})]),
        reply("", [tool_call("bash", {"command": "python tools/verify.py"})]),
        reply("DONE"),
    ]
    out = tmp_path / "out"
    with ScriptedChatServer(script) as server:
        rc = main(["optimize", str(model), "--policy", "openai", "--model", "scripted", "--base-url",
                   server.base_url, "--backend", "cpu", "--out", str(out), "--quiet"])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["verified"] and rep["policy"] == "openai" and rep["model"] == "scripted"
    assert (out / "best" / "kernels" / "s.cpp").read_text() == kernel
    assert "verified" in capfd.readouterr().out


def test_optimize_reports_bad_input_in_one_line(tmp_path, capfd):
    assert main(["optimize", str(tmp_path / "missing.py"), "--policy", "openai", "--model", "m"]) == 2
    assert "error: " in capfd.readouterr().err
    bad = tmp_path / "bad.py"
    bad.write_text("class Model:\n    pass\n")
    assert main(["optimize", str(bad), "--policy", "openai", "--model", "m"]) == 2
    err = capfd.readouterr().err
    assert "get_inputs" in err and "Traceback" not in err
    good = tmp_path / "m.py"
    good.write_text("import torch\n\nclass Model(torch.nn.Module):\n    def forward(self):\n        return torch.ones(1)\n"
                    "\ndef get_inputs():\n    return []\n\ndef get_init_inputs():\n    return []\n")
    assert main(["optimize", str(good), "--out", str(tmp_path / "o")]) == 2
    assert "no policy chosen" in capfd.readouterr().err
    assert main(["optimize", str(good), "--policy", "replay", "--out", str(tmp_path / "o")]) == 2
    assert "replay needs options.path" in capfd.readouterr().err
    assert main(["optimize", str(good), "--policy", "opnai"]) == 2
    assert "did you mean 'openai'" in capfd.readouterr().err


def test_the_report_says_when_a_speedup_was_measured_on_an_unsteady_host(tmp_path):
    from cuda_agent.core.types import (Candidate, CandidateOutcome, ProfileResult, Task, Timing, Trajectory,
                                       VerifyResult)
    from cuda_agent.sandbox.workspace.optimize import build_report, render_report

    why = "unsteady host: candidate spread 40% after 3 attempt(s), above 25%: result not trusted (the speedup may be noise)"
    prof = ProfileResult(ok=True, candidate=Timing(median_ms=1.0, spread=0.4), eager=Timing(median_ms=2.0, spread=0.05),
                         compile=Timing(median_ms=1.5, spread=0.05), metadata={"unsteady": why})
    traj = Trajectory(id="tr", task_id="t")
    traj.best = Candidate(turn=0, files={"model_new.py": "x"},
                          outcome=CandidateOutcome(verify=VerifyResult(ok=True), profile=prof))
    traj.candidates.append(traj.best)
    rep = build_report(Task(id="t", source="test", code=""), None, traj, "cpu", "replay", "", tmp_path)
    assert rep["unsteady"] == why
    text = render_report(rep, traj)
    assert "**Unsteady host: candidate spread 40%" in text and "quieter host" in text
    prof.metadata = {}
    assert "unsteady" not in render_report(build_report(Task(id="t", source="test", code=""), None, traj, "cpu",
                                                        "replay", "", tmp_path), traj).lower()
