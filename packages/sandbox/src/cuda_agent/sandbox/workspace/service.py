"""The workspace service: what the agent's ``tools/compile.py``, ``verify.py`` and
``profile.py`` talk to, and what each of their requests does.

One service per workspace serves HTTP over a Unix socket at ``<ws>/.cuda_agent/service.sock``
(:mod:`.unix_server`). A request builds a private copy of the agent's files and verifies
and profiles it through the judge's pipeline (:class:`..judge.pipeline.Judge`), reusing earlier results of unchanged files;
every verify/profile request is recorded in :attr:`WorkspaceService.history` with a
snapshot of the files and the results, and reported to ``on_result`` so the agent loop can
keep candidates. The answer's text for the agent comes from :mod:`.agent_text`; the
options are :class:`ServiceOptions` (:mod:`.service_options`).

Python API: :meth:`compile`, :meth:`verify`, :meth:`profile`, :meth:`evaluate`,
:meth:`score`; :func:`score_workspace` scores a workspace without any socket.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from cuda_agent.core.errors import CudaAgentError
from cuda_agent.core.safefs import Tree, UnsafePath
from cuda_agent.core.types import (
    CandidateOutcome,
    CompileResult,
    FailureCategory,
    ProfileResult,
    RewardResult,
    VerifyResult,
    to_jsonable,
)

from ..compilers.frozen import frozen_sources, name_workspace
from .agent_text import compile_answer, request_answer
from ..judge.pipeline import Judge
from .service_options import ServiceOptions
from .unix_server import ServiceSocket, remove_socket
from .workspace import agent_fingerprint, agent_refusals, append_record, snapshot_files

SOCKET_NAME = "service.sock"
STATE_DIR = ".cuda_agent"
ENV_SOCKET = "CUDA_AGENT_SERVICE"

__all__ = ["CHANGED", "ENV_SOCKET", "ServiceOptions", "WorkspaceService", "score_workspace"]


def _refused_compile(refused: list[str]) -> CompileResult:
    return CompileResult(ok=False, errors=list(refused[:8]))


def _refused_outcome(refused: list[str]) -> CandidateOutcome:
    """The outcome of files that were not built or run (nothing of them was executed)."""
    c = _refused_compile(refused)
    return CandidateOutcome(compile=c, verify=VerifyResult(ok=False, failure=FailureCategory.COMPILE_ERROR,
                                                           message=f"not built or run: {c.errors[0]}"))


CHANGED = ("model_new.py or kernels/ changed while they were being built and checked (a background process "
           "writing them?); no result of this run is kept: run the tool again once your files are written")


def _changed_compile() -> CompileResult:
    return _refused_compile([CHANGED])


def _files_hash(files: dict[str, str], extra: str = "") -> str:
    h = hashlib.sha256()
    for k in sorted(files):
        h.update(k.encode() + b"\0" + files[k].encode("utf-8", "replace") + b"\0")
    h.update(extra.encode())
    return h.hexdigest()[:16]


class WorkspaceService:
    """Compile/verify/profile for one workspace; see the module docstring."""

    def __init__(
        self,
        workspace: Any,
        compiler: Any = None,
        executor: Any = None,
        options: Any = None,
        *,
        reward: Any = None,
        on_result: Callable[[dict], None] | None = None,
        compile_executor: Any = None,
        socket_path: str | Path | None = None,
        pm: Any = None,
    ):
        self.workspace = workspace
        root = workspace if isinstance(workspace, (str, os.PathLike)) else getattr(workspace, "root", None)
        if root is None:
            raise CudaAgentError(f"workspace must be a path or a Workspace, got {type(workspace).__name__}")
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise CudaAgentError(f"workspace {self.root} does not exist")
        self.backend = getattr(workspace, "backend", None) or (
            "cpu" if getattr(compiler, "backend", "cuda") == "cpu" else "cuda")
        self.options = ServiceOptions.from_any(options)
        self.options.check_job_options()
        if compiler is None:
            compiler = getattr(workspace, "compiler", None)
        self.pm = pm
        self.jobs = Judge(self.options.judge_options(), executor, compiler, self.backend, compile_executor, pm=pm)
        self.reward = self._make_reward(reward)
        self.on_result = on_result
        self.context: dict[str, Any] = {}  # merged into each history entry (e.g. the agent turn)
        self.history: list[dict] = []
        self.state_dir = self.root / STATE_DIR
        self.socket_path = Path(socket_path) if socket_path else self.state_dir / SOCKET_NAME
        self._lock = threading.RLock()
        self._socket: ServiceSocket | None = None
        self._cache: dict[str, dict[str, Any]] = {}
        self._seq = 0
        self.errors: list[str] = []

    # -- construction helpers -----------------------------------------------------------

    def _make_reward(self, reward: Any) -> Any:
        if reward is None:
            reward = {"name": "milestone"}
        if isinstance(reward, (str, dict)) or hasattr(reward, "keys"):
            from cuda_agent.core.plugins import get_plugin_manager

            spec = {"name": reward} if isinstance(reward, str) else reward
            return (self.pm or get_plugin_manager()).create("reward", spec, where="reward")
        return reward

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> "WorkspaceService":
        """Bind the socket and serve in a background thread; start the executor's workers."""
        if self._socket is not None:
            return self
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._socket = ServiceSocket(self.socket_path, self, thread_name=f"service-{self.root.name}")
        self.jobs.start()
        return self

    def close(self) -> None:
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()
        remove_socket(self.socket_path)
        self.jobs.close()

    def __enter__(self) -> "WorkspaceService":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def env(self) -> dict[str, str]:
        """Environment for processes that run the tool scripts (the agent's shell)."""
        return {ENV_SOCKET: str(self.socket_path)}

    # -- snapshot and cache --------------------------------------------------------------

    def snapshot(self) -> dict[str, str]:
        """The agent's files, read without following any link (see :mod:`.workspace`)."""
        return snapshot_files(self.root)

    def refusals(self) -> list[str]:
        """Why the agent's files are not built or judged as they are (links, hard links...)."""
        return agent_refusals(self.root)

    def _key(self, files: dict[str, str]) -> str:
        try:
            extra = Tree(self.root).read_text("model.py")
        except (OSError, UnsafePath):
            extra = ""
        extra += json.dumps(to_jsonable(self.options.verify_options), sort_keys=True)
        extra += json.dumps(to_jsonable(self.options.profile_options), sort_keys=True)
        return _files_hash(files, extra)

    # -- operations ---------------------------------------------------------------------------

    def compile(self) -> CompileResult:
        with self._lock:
            refused = self.refusals()
            if refused:
                return _refused_compile(refused)
            before = agent_fingerprint(self.root)
            c = self._compile()
            return c if agent_fingerprint(self.root) == before else _changed_compile()

    def _compile(self) -> CompileResult:
        """Build a private copy of the sources (see :mod:`..compilers.frozen`) into the workspace's
        build folder."""
        with frozen_sources(self.root) as src:
            return name_workspace(self.jobs.build(src, self.state_dir / "build"), src, self.root)

    def verify(self, fresh: bool = False) -> VerifyResult:
        return self._request("verify", fresh)["outcome"].verify

    def profile(self, fresh: bool = False) -> ProfileResult:
        out = self._request("profile", fresh)["outcome"]
        if out.profile is None:  # not profiled because it did not verify
            v = out.verify
            return ProfileResult(ok=False, failure=v.failure if v else FailureCategory.MISSING,
                                 message="not profiled: " + (v.message if v else "no verification"))
        return out.profile

    def evaluate(self, fresh: bool = False) -> CandidateOutcome:
        """Compile + verify + profile the current files (what the episode's end is scored on)."""
        return self._request("evaluate", fresh)["outcome"]

    def score(self, outcome: CandidateOutcome | None = None, fresh: bool = False) -> RewardResult:
        """RewardResult of ``outcome`` (by default: evaluate the current files) with the reward plugin."""
        if outcome is None:
            outcome = self.evaluate(fresh=fresh)
        return self.reward.score(outcome)

    def _request(self, kind: str, fresh: bool = False) -> dict:
        with self._lock:
            t0 = time.monotonic()
            before = agent_fingerprint(self.root)
            files = self.snapshot()
            key = self._key(files)
            refused = self.refusals()
            if refused:  # links and the like: nothing is built or run of them
                return self._record(kind, t0, files, key, _refused_outcome(refused), [])
            outcome, reused = self._judge(kind, key, fresh)
            if agent_fingerprint(self.root) != before:
                # an entry was replaced or written meanwhile: what the tools read may not be what
                # the agent could read, and the verdict may not be the snapshot's: none is kept
                return self._record(kind, t0, files, key, _refused_outcome([CHANGED]), [], report=False)
            if outcome.compile is not None and outcome.compile.ok and self.options.reuse_results:
                slot = self._cache.setdefault(key, {})
                if outcome.verify is not None and outcome.verify.ok:
                    slot["verify"] = outcome.verify
                if outcome.profile is not None and outcome.profile.ok:
                    slot["profile"] = outcome.profile
            return self._record(kind, t0, files, key, outcome, reused)

    def _judge(self, kind: str, key: str, fresh: bool) -> tuple[CandidateOutcome, list[str]]:
        """Compile, verify and profile the current files as ``kind`` asks; which results
        came from the cache."""
        cached = None if fresh or not self.options.reuse_results else self._cache.get(key)
        if kind != "compile" and self.jobs.options.baselines_ahead:  # measured while the build runs
            self.jobs.measure_ahead(self.root)
        c = self._compile()
        outcome = CandidateOutcome(compile=c)
        reused: list[str] = []
        want_verify = kind == "verify" or kind == "evaluate" or self.options.profile_verifies
        want_profile = kind in ("profile", "evaluate")
        cached_v = c.ok and cached and cached.get("verify") is not None and cached["verify"].ok
        if want_verify and want_profile and c.ok and not cached_v and self.options.evaluate_job:
            both = self.jobs.evaluate(self.root, job=self.options.evaluate_job)
            if both is not None:
                outcome.verify, outcome.profile = both
                want_verify = want_profile = False
        if want_verify:
            if cached_v:
                outcome.verify = cached["verify"]
                reused.append("verify")
            else:
                outcome.verify = self.jobs.verify(self.root, c)
        if want_profile and c.ok and (outcome.verify is None or outcome.verify.ok):
            if cached and cached.get("profile") is not None and cached["profile"].ok:
                outcome.profile = cached["profile"]
                reused.append("profile")
            else:
                outcome.profile = self.jobs.profile(self.root)
        return outcome, reused

    def _record(self, kind: str, t0: float, files: dict[str, str], key: str, outcome: CandidateOutcome,
                reused: list[str], report: bool = True) -> dict:
        """Score ``outcome``, keep it in the history and report it to ``on_result`` (unless
        not ``report``: a run whose files changed under it says nothing of ``files``)."""
        reward = None
        try:
            reward = self.reward.score(outcome) if self.reward is not None else None
        except Exception as exc:
            self.log_error(exc)
        self._seq += 1
        entry = {
            "id": self._seq,
            "kind": kind,
            "time": time.time(),
            "seconds": time.monotonic() - t0,
            "files": files,
            "files_hash": key,
            "outcome": outcome,
            "reward": reward,
            "reused": reused,
            **self.context,
        }
        if kind != "compile":
            self.history.append(entry)
            if len(self.history) > self.options.history_limit:
                del self.history[: len(self.history) - self.options.history_limit]
            self._append_history_file(entry)
        if self.on_result is not None and report:
            try:
                self.on_result(entry)
            except Exception as exc:
                self.log_error(exc)
        return entry

    # -- answers and history -----------------------------------------------------------------

    def handle(self, endpoint: str, fresh: bool = False) -> dict:
        """Serve one tool request: JSON with ``text`` for the agent and the raw ``result``."""
        if endpoint == "compile":
            return compile_answer(self.compile())
        return request_answer(endpoint, self._request(endpoint, fresh))

    def summary(self, entry: dict) -> dict:
        out: CandidateOutcome = entry["outcome"]
        r: RewardResult | None = entry.get("reward")
        p = out.profile
        return {
            "id": entry["id"],
            "kind": entry["kind"],
            "time": entry["time"],
            "files_hash": entry["files_hash"],
            "failure": out.failure.value,
            "correct": out.correct,
            "speedup_vs_compile": p.speedup_vs_compile() if p is not None and p.ok else None,
            "reward": r.value if r is not None else None,
        }

    def _append_history_file(self, entry: dict) -> None:
        if not self.options.history_file:
            return
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            line = (json.dumps(to_jsonable(entry), default=str) + "\n").encode()
            append_record(self.state_dir / self.options.history_file, line, self.root)
        except (OSError, TypeError, ValueError) as exc:
            self.log_error(exc)

    def log_error(self, exc: BaseException) -> None:
        self.errors.append("".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:])


def score_workspace(
    workspace: Any,
    compiler: Any = None,
    executor: Any = None,
    reward: Any = None,
    options: Any = None,
) -> RewardResult:
    """Compile, verify, profile and score a workspace in-process (no socket)."""
    svc = WorkspaceService(workspace, compiler, executor, options, reward=reward)
    try:
        return svc.score(fresh=True)
    finally:
        svc.close()

