"""The worked third-party plugin: installed it adds a reward; uninstalled it is gone.

The install test builds a clean virtual environment holding only core, rewards and this
plugin (no torch), so it also proves that core + rewards install and run without torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PLUGIN = HERE.parent
REPO = PLUGIN.parents[1]
sys.path.insert(0, str(PLUGIN / "src"))

import cuda_agent_example_reward as example  # noqa: E402

from cuda_agent.core.plugins import PluginManager  # noqa: E402
from cuda_agent.core.types import (  # noqa: E402
    CandidateOutcome,
    CompileResult,
    FailureCategory,
    ProfileResult,
    Timing,
    VerifyResult,
)


def _outcome(t_candidate: float, t_compile: float, ok: bool = True) -> CandidateOutcome:
    return CandidateOutcome(
        compile=CompileResult(ok=True),
        verify=VerifyResult(ok=ok, failure=FailureCategory.NONE if ok else FailureCategory.WRONG_RESULT),
        profile=ProfileResult(
            ok=True,
            candidate=Timing(t_candidate),
            eager=Timing(t_compile * 2),
            compile=Timing(t_compile),
        ),
    )


def test_reward_values_when_registered_explicitly():
    pm = PluginManager(load_entry_points=False)
    pm.register(example, "example-reward")
    reward = pm.create("reward", {"name": "log_speedup", "options": {"penalty": -3}})
    assert reward.score(_outcome(1.0, 2.0)).value == pytest.approx(1.0)
    assert reward.score(_outcome(2.0, 2.0)).value == pytest.approx(0.0)
    assert reward.score(_outcome(100.0, 1.0)).value == pytest.approx(-1.0)  # floor
    wrong = reward.score(_outcome(1.0, 2.0, ok=False))
    assert wrong.value == -3 and wrong.failure is FailureCategory.WRONG_RESULT


def _run(args, env, cwd=None):
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


@pytest.mark.timeout(900)
def test_install_and_uninstall_in_clean_env(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    py = str(env_dir / "bin" / "python")
    cli = str(env_dir / "bin" / "cuda-agent")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_AGENT_")}
    env.pop("PYTHONPATH", None)
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]

    r = _run(pip + [str(REPO / "packages/core"), str(REPO / "packages/rewards")], env)
    assert r.returncode == 0, r.stdout + r.stderr

    # core + rewards alone: work, and never import torch (which is not even installed)
    probe = (
        "import sys, cuda_agent.core.cli, cuda_agent.rewards;"
        "from cuda_agent.core.config import compose;"
        "cfg = compose([], ['reward.name=speedup']);"
        "assert cfg.reward.options.baseline == 'compile';"
        "assert 'torch' not in sys.modules; print('ok')"
    )
    r = _run([py, "-c", probe], env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    r = _run([py, "-c", "import torch"], env)
    assert r.returncode != 0

    r = _run([cli, "plugins", "--kind", "reward"], env)
    assert r.returncode == 0, r.stderr
    assert "milestone" in r.stdout and "log_speedup" not in r.stdout
    r = _run([cli, "config", "show", "reward.name=log_speedup"], env)
    assert r.returncode == 2 and "unknown reward 'log_speedup'" in r.stderr

    r = _run(pip + ["--no-deps", str(PLUGIN)], env)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run([cli, "plugins", "--kind", "reward"], env)
    row = [line for line in r.stdout.splitlines() if "log_speedup" in line]
    assert row and "cuda-agent-example-reward" in row[0] and "0.1.0" in row[0], r.stdout
    r = _run([cli, "config", "show", "reward.name=log_speedup", "reward.options.penalty=-4"], env)
    assert r.returncode == 0, r.stderr
    assert "penalty: -4" in r.stdout and "floor: -1.0" in r.stdout

    # autoload off: gone unless named; blocked: gone
    r = _run([cli, "plugins", "--kind", "reward"], {**env, "CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "log_speedup" not in r.stdout
    r = _run(
        [cli, "plugins", "--kind", "reward"],
        {**env, "CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD": "1", "CUDA_AGENT_PLUGINS": "example-reward"},
    )
    assert "log_speedup" in r.stdout
    r = _run([cli, "plugins", "--kind", "reward"], {**env, "CUDA_AGENT_BLOCK_PLUGINS": "example-reward"})
    assert "log_speedup" not in r.stdout

    r = _run([py, "-m", "pip", "uninstall", "-y", "-q", "cuda-agent-example-reward"], env)
    assert r.returncode == 0, r.stderr
    r = _run([cli, "plugins", "--kind", "reward"], env)
    assert "log_speedup" not in r.stdout
    r = _run([cli, "config", "show", "reward.name=log_speedup"], env)
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error: unknown reward 'log_speedup'")
