"""The CUDA environment for training: one fresh workspace per episode (``CudaEnvironment`` of
cuda-agent-sandbox), sharing one executor (the GPU/CPU job pool) across all episodes."""

from __future__ import annotations

import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.core.errors import ConfigError, did_you_mean
from cuda_agent.core.interfaces import EnvironmentFactory


@dataclass
class CudaOptions:
    workdir: str | None = None  # where episode workspaces are made (a temporary folder when None)
    keep_workspaces: bool = False  # keep the temporary folder after training
    # EnvironmentOptions fields for the training episodes, over the run's `environment:` section
    environment: dict = field(default_factory=dict)


def _sandbox_environment() -> Any:
    try:
        from cuda_agent.sandbox.workspace import environment
    except ImportError as exc:
        raise ConfigError("environment cuda needs cuda_agent.sandbox.workspace.environment.CudaEnvironment "
                          f"(install cuda-agent-sandbox): {exc}") from exc
    return environment


class CudaEnvironmentFactory(EnvironmentFactory):
    name = "cuda"
    description = "A fresh CUDA workspace, sandbox and workspace service per episode; one shared executor pool."
    Options = CudaOptions

    def __init__(self, options: CudaOptions | None = None):
        super().__init__(options)
        self._sandbox = _sandbox_environment()
        names = list(self._sandbox.EnvironmentOptions.__dataclass_fields__)
        for key in self.options.environment:
            if key not in names:
                raise ConfigError(f"unknown option trainer.environment.options.environment.{key} for environment "
                                  f"'cuda'; {did_you_mean(key, names)}")
        self._tmp = None
        self._lock = threading.Lock()  # episodes are made from several threads at once
        self.cfg = None
        self.pm = None
        self.executor = None

    def bind(self, cfg: Any, pm: Any) -> None:
        """Take the environment, compiler, sandbox, executor and reward specs from the run config."""
        self.cfg = cfg
        self.pm = pm

    def _spec(self, key: str) -> Any:
        if self.cfg is None or key not in self.cfg:
            return None
        from omegaconf import OmegaConf

        node = self.cfg.get(key)
        return OmegaConf.to_container(node, resolve=True) if node is not None else None

    def _root(self) -> Path:
        if self.options.workdir:
            Path(self.options.workdir).mkdir(parents=True, exist_ok=True)
            return Path(self.options.workdir)
        with self._lock:  # one folder: a second one would replace it and be deleted under its users
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="cuda-agent-train-")
            return Path(self._tmp.name)

    def env_options(self) -> Any:
        """The episodes' EnvironmentOptions: the run's ``environment:`` section (and top-level
        ``backend``), then this environment's ``options.environment``."""
        return self._sandbox.environment_options(self.cfg, **self.options.environment)

    def make(self, task: Any, dest: Path | None = None) -> Any:
        opts = self.env_options()
        with self._lock:  # one executor pool for all episodes
            if self.executor is None:
                spec = self._spec("executor")
                if spec and spec.get("name"):
                    from cuda_agent.sandbox.executors.configured import executor_spec

                    # the run's backend reaches the executor (local -> cpu, ray's backend option);
                    # under auto only the GPU pool changes, on a machine with no usable GPU
                    if opts.backend != "auto":
                        spec = executor_spec(spec, opts.backend, self.pm)
                    elif spec["name"] == "local" and self._sandbox.detect_backend("auto") == "cpu":
                        spec = executor_spec(spec, "cpu", self.pm)
                    self.executor = self.pm.create("executor", spec, where="executor")
        dest = dest or self._root() / f"{task.id.replace('/', '_')}-{uuid.uuid4().hex[:8]}"
        return self._sandbox.CudaEnvironment.from_config(task, dest, self.cfg, self.pm, executor=self.executor,
                                                         options=opts)

    def close(self) -> None:
        executor, self.executor = self.executor, None
        if executor is not None:
            executor.close()
        if not self.options.keep_workspaces:  # else the folder stays (cleaned when the factory goes)
            tmp, self._tmp = self._tmp, None
            if tmp is not None:
                tmp.cleanup()
