"""The ``service:`` section of a run config: how the workspace service builds, verifies and
profiles (timeouts, which job functions and their options, result reuse, history).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from cuda_agent.core.errors import ConfigError

from ..judge.pipeline import PROFILE_JOB, VERIFY_JOB, JudgeOptions, judge_options


@dataclass
class ServiceOptions:
    """The ``service:`` section of a run config (its defaults are these; the sandbox's config
    fragment is made from them)."""

    compile_timeout: float = 300.0  # seconds for one build (killed with its process group after)
    compile_memory_mb: int = 0  # address-space limit of the compile worker (0: none)
    compile_in: str = "worker"  # worker (a separate, killable process) | inline
    verify_timeout: float = 120.0  # per verification job
    profile_timeout: float = 300.0  # per profiling job
    verify_job: str = VERIFY_JOB
    profile_job: str = PROFILE_JOB
    # verify+profile as one job (one worker start instead of two; a hang then costs both
    # timeouts), e.g. cuda_agent.sandbox.judge.tasks:evaluate; "" = two jobs, each with its own timeout
    evaluate_job: str = ""
    verify_options: dict = field(default_factory=dict)  # passed to the verification job (VerifyOptions fields)
    profile_options: dict = field(default_factory=dict)  # passed to the profiling job (ProfileOptions fields)
    profile_verifies: bool = True  # profile = build + verify (reused when files are unchanged) + time
    reuse_results: bool = True  # unchanged files -> the earlier verify/profile result is returned
    history_limit: int = 1000  # requests kept in service.history
    history_file: str = "history.jsonl"  # every request as a JSON line in <ws>/.cuda_agent/ ("" = none)

    @classmethod
    def from_any(cls, options: Any) -> "ServiceOptions":
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(options, DictConfig):
                options = OmegaConf.to_container(options, resolve=True)
        except ImportError:  # pragma: no cover
            pass
        if not isinstance(options, dict):
            raise ConfigError(f"service options must be a mapping, got {type(options).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            from cuda_agent.core.errors import did_you_mean

            raise ConfigError(f"unknown service option {unknown[0]!r}; {did_you_mean(unknown[0], names)}")
        opts = cls(**options)
        if opts.compile_in not in ("worker", "inline"):
            raise ConfigError(f"service.compile_in must be 'worker' or 'inline', got {opts.compile_in!r}")
        return opts

    def judge_options(self) -> JudgeOptions:
        """The judge's options (:class:`..judge.pipeline.JudgeOptions`) these map onto;
        the service judges workspaces, which are built, not prebuilt."""
        return judge_options(self, prebuild=False)

    def check_job_options(self) -> None:
        """Unknown verify/profile options are a config error now, not a failed job later."""
        self.judge_options().check_job_options("service")
