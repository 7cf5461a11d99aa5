"""Bad config values are refused when the config is composed: one line naming the key,
what it takes and what it got; no stack trace, no run started (through the real CLI)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from cuda_agent.core.config import compose
from cuda_agent.core.errors import ConfigError

SECTIONS = compose()
needs = {name: pytest.mark.skipif(name not in SECTIONS, reason=f"no {name} section (its package is not installed)")
         for name in ("trainer", "service", "eval")}


def cli(*args, timeout=60):
    env = dict(os.environ, CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.run([sys.executable, "-m", "cuda_agent.core.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


CASES = [
    pytest.param("agent.max_turns=abc", "agent.max_turns: expected an integer", id="max_turns"),
    pytest.param("agent.tool_output_chars=abc", "agent.tool_output_chars: expected an integer", id="tool_output_chars"),
    pytest.param("agent=[", "bad override 'agent=[': the value is not valid YAML", id="bad-yaml"),
    pytest.param("agent.max_turns=-1", "agent.max_turns: must be at least 1, got -1", id="negative-turns"),
    pytest.param("agent=[1, 2]", "agent: expected a mapping", id="list-for-mapping"),
    pytest.param("trainer.rollout.concurrency=abc", "trainer.rollout.concurrency: expected an integer",
                 id="concurrency", marks=needs["trainer"]),
    pytest.param("trainer.stages.0.steps=abc", "trainer.stages[0].steps: expected an integer",
                 id="stage-steps", marks=needs["trainer"]),
    pytest.param("trainer.stages.7.steps=3", "trainer.stages is a list of 4 item(s)", id="stage-index",
                 marks=needs["trainer"]),
    pytest.param("service.verify_timeout=abc", "service.verify_timeout: expected a number",
                 id="verify_timeout", marks=needs["service"]),
    pytest.param("eval.max_infra_error_share=2", "eval.max_infra_error_share: must be at most 1, got 2",
                 id="share", marks=needs["eval"]),
]


@pytest.mark.parametrize("override, message", CASES)
def test_config_show_refuses_bad_values(override, message):
    r = cli("config", "show", override)
    assert r.returncode == 2, r.stdout[-500:] + r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert message in lines[0], lines[0]
    assert r.stdout == ""


def test_values_in_files_are_checked_and_numbers_written_as_text_converted(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("agent:\n  max_turns: many\n")
    with pytest.raises(ConfigError, match=r"agent.max_turns: expected an integer.*'many'"):
        compose([f])
    # YAML files read 1e-3 as text: a number field gets the number
    f.write_text("agent:\n  max_turns: '12'\n")
    cfg = compose([f], ["logging.level=debug"])
    assert cfg.agent.max_turns == 12 and isinstance(cfg.agent.max_turns, int)


@needs["service"]
def test_bad_service_value_stops_optimize_before_it_starts(tmp_path):
    """``service.verify_timeout=abc`` once killed the executor thread and the run hung; now the
    command ends at once with the one-line error and makes no output folder."""
    model = tmp_path / "model.py"
    model.write_text(textwrap.dedent("""
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return x + 1
        def get_inputs():
            return [torch.randn(4)]
        def get_init_inputs():
            return []
    """))
    out = tmp_path / "out"
    r = cli("optimize", str(model), "--policy", "replay", "--backend", "cpu", "--out", str(out),
            "service.verify_timeout=abc", timeout=60)
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.strip().splitlines() == ["error: bad value for service.verify_timeout: expected a number, "
                                             "got 'abc'"], r.stderr[-3000:]
    assert "Traceback" not in r.stderr and not out.exists()
