"""``wandb`` tracker: each step's metrics go to a Weights & Biases run.

Install: ``pip install -e plugins/tracker-wandb``; select with
``trackers: [{name: wandb, options: {project: cuda-agent}}]``. ``mode: offline`` writes
the run to the run folder for a later ``wandb sync``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.hookspecs import hookimpl
from cuda_agent.core.interfaces import Tracker


@dataclass
class WandbOptions:
    project: str = "cuda-agent"
    entity: str | None = None
    name: str | None = None  # default: the run folder's name
    mode: str = "online"  # online | offline | disabled
    tags: list[str] = field(default_factory=list)


class WandbTracker(Tracker):
    name = "wandb"
    description = "Log each step's metrics to Weights & Biases."
    Options = WandbOptions

    def __init__(self, options=None, run_dir=None):
        super().__init__(options)
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError(f"tracker wandb needs the wandb package (pip install wandb): {exc}")
        o = self.options
        self._wandb = wandb
        self.run = wandb.init(project=o.project, entity=o.entity, name=o.name or (Path(run_dir).name if run_dir else None),
                              mode=o.mode, tags=list(o.tags), dir=str(run_dir) if run_dir else None, reinit=True)

    def log(self, step: int, metrics: dict) -> None:
        data = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.run.log(data, step=step)

    def close(self) -> None:
        self.run.finish()


@hookimpl
def register_trackers(register):
    register(WandbTracker)
