"""The CUDA environment for training: one fresh workspace per episode (``CudaEnvironment`` of
cuda-agent-sandbox), sharing one executor (the GPU/CPU job pool) across all episodes."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any


class CudaEnvironmentFactory:
    def __init__(self, workdir: str | None = None, keep_workspaces: bool = False, **env_options: Any):
        from cuda_agent.sandbox.environment import EnvironmentOptions

        self.env_options = EnvironmentOptions(**env_options)
        self._explicit = bool(env_options)  # options given here win over the run config's environment:
        self.workdir = workdir
        self.keep = keep_workspaces
        self._tmp = None
        self.cfg = None
        self.pm = None
        self.executor = None

    def bind(self, cfg: Any, pm: Any) -> None:
        """Take the compiler, sandbox, executor and reward specs from the run config."""
        self.cfg = cfg
        self.pm = pm

    def _spec(self, key: str) -> Any:
        if self.cfg is None or key not in self.cfg:
            return None
        from omegaconf import OmegaConf

        node = self.cfg.get(key)
        return OmegaConf.to_container(node, resolve=True) if node is not None else None

    def _root(self) -> Path:
        if self.workdir:
            Path(self.workdir).mkdir(parents=True, exist_ok=True)
            return Path(self.workdir)
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="cuda-agent-train-")
        return Path(self._tmp.name)

    def make(self, task: Any, dest: Path | None = None) -> Any:
        from cuda_agent.sandbox.environment import CudaEnvironment, EnvironmentOptions, detect_backend

        opts = self.env_options
        if self.cfg is not None and "environment" in self.cfg and not self._explicit:
            base = {k: v for k, v in (self._spec("environment") or {}).items()
                    if k in {f for f in EnvironmentOptions.__dataclass_fields__}}
            if "backend" in self.cfg and "backend" not in base:
                base["backend"] = self.cfg.backend
            opts = EnvironmentOptions(**base)
        if self.executor is None:
            spec = self._spec("executor")
            if spec and spec.get("name"):
                if detect_backend(opts.backend) == "cpu" and spec["name"] == "local":
                    spec = {"name": "cpu"}
                self.executor = self.pm.create("executor", spec, where="executor")
        dest = dest or self._root() / f"{task.id.replace('/', '_')}-{uuid.uuid4().hex[:8]}"
        return CudaEnvironment(task, dest, opts, compiler=self._spec("compiler"), sandbox=self._spec("sandbox"),
                               executor=self.executor, reward=self._spec("reward"),
                               service_options=self._spec("service"), pm=self.pm)

    def close(self) -> None:
        if self.executor is not None and hasattr(self.executor, "close"):
            self.executor.close()
            self.executor = None
        if self._tmp is not None and not self.keep:
            self._tmp.cleanup()
            self._tmp = None
