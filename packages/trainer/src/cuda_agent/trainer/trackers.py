"""TensorBoard tracker (needs the ``tensorboard`` package: ``pip install cuda-agent-trainer[tensorboard]``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.interfaces import Tracker


@dataclass
class TensorBoardOptions:
    log_dir: str = "tensorboard"  # relative paths are inside the run folder
    flush_secs: int = 30


class TensorBoardTracker(Tracker):
    name = "tensorboard"
    description = "Write each step's numeric metrics as TensorBoard scalars."
    Options = TensorBoardOptions

    def __init__(self, options=None, run_dir=None):
        super().__init__(options)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ConfigError(f"tracker tensorboard needs the tensorboard package (pip install tensorboard): {exc}")
        path = Path(self.options.log_dir)
        if run_dir is not None and not path.is_absolute():
            path = Path(run_dir) / path
        self.path = path
        self.writer = SummaryWriter(log_dir=str(path), flush_secs=self.options.flush_secs)

    def log(self, step: int, metrics: dict) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.writer.add_scalar(k, float(v), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
