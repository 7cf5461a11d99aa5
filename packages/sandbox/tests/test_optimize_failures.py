"""``cuda-agent optimize`` when something other than the agent fails: a model.py that does not
run is refused before the agent starts (checked in a child process without our rights), and
a policy endpoint that is down is said to be down, not scored as the model's failure."""

from __future__ import annotations

import importlib.util
import json
import os
import textwrap

import pytest

from cuda_agent.core.agent.testing import ScriptedChatServer
from cuda_agent.core.cli import main
from cuda_agent.sandbox.workspace.modelcheck import check_model

needs_jobs = pytest.mark.skipif(
    importlib.util.find_spec("cuda_agent.sandbox.judge.jobs") is None,
    reason="verification/profiling jobs (cuda_agent.sandbox.judge.jobs) are not installed",
)

GOOD = textwrap.dedent("""
    import os
    import torch


    class Model(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.lin = torch.nn.Linear(n, n)

        def forward(self, x):
            return self.lin(x)


    def get_inputs():
        return [torch.randn(2, 8)]


    def get_init_inputs():
        return [8]
""")


def _optimize(tmp_path, model_text: str, server, *extra):
    model = tmp_path / "model.py"
    model.write_text(model_text)
    out = tmp_path / "out"
    rc = main(["optimize", str(model), "--policy", "openai", "--model", "m", "--base-url", server.base_url,
               "--backend", "cpu", "--out", str(out), "--quiet", *extra])
    return rc, out


@pytest.mark.parametrize("change, message", [
    pytest.param(("import torch\n", "import torch\nimport not_a_real_package\n"),
                 "import failed: ModuleNotFoundError: No module named 'not_a_real_package' (line 4)", id="import"),
    pytest.param(("class Model(torch.nn.Module):", "from not_a_real_package import Model\n\n\nclass _M(torch.nn.Module):"),
                 "import failed: ModuleNotFoundError", id="imported-Model"),
    pytest.param(("torch.randn(2, 8)]", "torch.randn(2, 8) @ torch.randn(2, 8)]"),
                 "get_inputs() failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied", id="get_inputs"),
    pytest.param(("torch.randn(2, 8)]", "torch.randn(2, 5)]"), "the forward pass failed: RuntimeError", id="forward"),
])
def test_model_that_does_not_run_stops_before_the_agent(tmp_path, capfd, change, message):
    with ScriptedChatServer([]) as server:
        rc, out = _optimize(tmp_path, GOOD.replace(*change), server)
    err = capfd.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {tmp_path / 'model.py'}: ") and message in err[0], err[0]
    assert server.requests == [] and not out.exists()  # no episode, no run folder


def test_model_check_runs_without_our_rights(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(GOOD.replace("return [8]", "open(os.path.expanduser('~/probe'), 'w').write(str(os.geteuid()))\n"
                                  "    return [8]"))
    report = check_model(model)
    assert report["ok"]
    if os.geteuid() == 0:  # as root, the child became another user, in a private home folder
        assert report["privileges"].startswith("dropped to uid"), report
    assert not os.path.exists(os.path.expanduser("~/probe"))


@needs_jobs
def test_endpoint_down_is_reported_as_such(tmp_path, capfd):
    """The endpoint answers 500 past its retries: optimize exits non-zero saying the endpoint
    failed; no reward is recorded (not "no verified solution ... reward -1")."""
    with ScriptedChatServer([], final={"status": 500, "body": "upstream down"}) as server:
        rc, out = _optimize(tmp_path, GOOD, server, "policy.options.max_retries=2", "policy.options.backoff=0.01")
    captured = capfd.readouterr()
    err = captured.err.strip().splitlines()
    assert rc == 2, captured.err[-3000:]
    assert err[-1].startswith("error: the policy endpoint failed: HTTP 500") and "nothing was scored" in err[-1]
    assert "gave up after 3 attempts" in err[-1] and "no verified solution" not in captured.out
    rep = json.loads((out / "report.json").read_text())
    assert rep["finish_reason"] == "infra_error" and rep["reward"] is None and "upstream down" in rep["error"]
    assert "The policy endpoint failed; nothing was scored." in (out / "report.md").read_text()
    events = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "policy.retry" for e in events) == 2
    assert events[-1]["event"] == "run.end" and events[-1]["status"] == "infra_error"
