"""The wandb tracker plugin, logging a real offline run to disk (no network)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import cuda_agent_wandb  # noqa: E402

from cuda_agent.core.config import compose  # noqa: E402
from cuda_agent.core.errors import ConfigError  # noqa: E402
from cuda_agent.core.plugins import PluginManager  # noqa: E402


def _pm() -> PluginManager:
    pm = PluginManager()
    pm.register(cuda_agent_wandb, "wandb")
    return pm


def test_selectable_from_config_with_checked_options():
    pm = _pm()
    cfg = compose([], ["trackers=[{name: wandb, options: {mode: offline, project: p}}]"], pm=pm)
    assert cfg.trackers[0].options.project == "p"
    with pytest.raises(ConfigError, match="did you mean 'project'"):
        compose([], ["trackers=[{name: wandb, options: {projct: p}}]"], pm=pm)


def test_offline_run_is_written(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb package is not installed (pip install wandb)")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    tracker = _pm().create("tracker", {"name": "wandb", "options": {"mode": "offline", "project": "t"}},
                           run_dir=tmp_path)
    for step in range(3):
        tracker.log(step, {"reward/mean": 0.1 * step, "note": "text is dropped", "flag": True})
    tracker.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list(tmp_path.rglob("*"))
    assert list(runs[0].glob("*.wandb")), "no run file written"
    summary = next(runs[0].rglob("wandb-summary.json"), None)
    if summary is not None:
        assert '"reward/mean"' in summary.read_text()
