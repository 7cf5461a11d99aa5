"""The workspace service: what the agent's ``tools/compile.py``, ``verify.py`` and
``profile.py`` talk to.

One service per workspace serves HTTP over a Unix socket at
``<ws>/.cuda_agent/service.sock``. Compiles run host-side through the configured
Compiler plugin in a separate, killable, resource-limited worker process; verification
and profiling are jobs on the shared Executor pool (GPU or CPU). Every verify/profile
request is recorded in :attr:`WorkspaceService.history` with a snapshot of the files and
the results, and reported to ``on_result`` so the agent loop can keep candidates.

Endpoints (POST, JSON in and out): ``/compile``, ``/verify``, ``/profile``, ``/evaluate``;
GET ``/health`` and ``/history``. Each answer carries ``text`` (what the tool script
prints: short and actionable), ``exit_code`` and ``result`` (the dataclass as JSON).

Python API: :meth:`compile`, :meth:`verify`, :meth:`profile`, :meth:`evaluate`,
:meth:`score`; :func:`score_workspace` scores a workspace without any socket.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import os
import socket
import socketserver
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cuda_agent.core.errors import ConfigError, CudaAgentError
from cuda_agent.core.types import (
    CandidateOutcome,
    CompileResult,
    FailureCategory,
    ProfileResult,
    RewardResult,
    Timing,
    VerifyResult,
    to_jsonable,
)

from cuda_agent.core.safefs import Tree, UnsafePath

from ..executors.job import Job, JobError, format_seconds
from ..compilers.frozen import frozen_sources, name_workspace
from .workspace import agent_fingerprint, agent_refusals, append_record, snapshot_files

SOCKET_NAME = "service.sock"
STATE_DIR = ".cuda_agent"
ENV_SOCKET = "CUDA_AGENT_SERVICE"
_MAX_UNIX_PATH = 107  # sun_path is 108 bytes on Linux, the final NUL included


@dataclass
class ServiceOptions:
    """The ``service:`` section of a run config (its defaults are these; the sandbox's config
    fragment is made from them)."""

    compile_timeout: float = 300.0  # seconds for one build (killed with its process group after)
    compile_memory_mb: int = 0  # address-space limit of the compile worker (0: none)
    compile_in: str = "worker"  # worker (a separate, killable process) | inline
    verify_timeout: float = 120.0  # per verification job
    profile_timeout: float = 300.0  # per profiling job
    verify_job: str = "cuda_agent.sandbox.judge.tasks:verify"
    profile_job: str = "cuda_agent.sandbox.judge.tasks:profile"
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


# --- compile job (runs in the compile worker) ----------------------------------------


def compile_job(compiler: Any, workspace: str, build_dir: str | None = None) -> CompileResult:
    """Build ``workspace`` with ``compiler`` (a Compiler instance, or a {name, options} spec)
    into ``build_dir`` (default: the workspace's own)."""
    if isinstance(compiler, (dict, str)):
        from cuda_agent.core.plugins import get_plugin_manager

        compiler = get_plugin_manager().create("compiler", compiler)
    if build_dir is None:
        return compiler.build(Path(workspace))
    return compiler.build(Path(workspace), Path(build_dir))


# --- text for the agent ----------------------------------------------------------------


def _fmt_err(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1e}"


def _ms(t: Timing | None) -> str:
    if t is None:
        return "n/a"
    return f"{t.median_ms:.4g} ms" if t.median_ms < 1000 else f"{t.median_ms / 1000:.3g} s"


def _details_tail(details: str, lines: int = 8) -> str:
    rows = [r for r in (details or "").strip().splitlines() if r.strip()]
    if not rows:
        return ""
    return "\n".join("  " + r[:300] for r in rows[-lines:])


def compile_text(c: CompileResult) -> str:
    if c.ok:
        how = "cached" if c.cached else (
            "rebuilt: " + ", ".join(c.rebuilt_units[:6]) if c.rebuilt_units else "built")
        return f"COMPILE OK in {c.seconds:.1f} s ({how})"
    lines = [f"COMPILE FAILED ({len(c.errors)} error{'s' if len(c.errors) != 1 else ''}):" if c.errors
             else "COMPILE FAILED:"]
    for e in c.errors[:8]:
        lines.append("  " + e.strip()[:400])
    if len(c.errors) > 8:
        lines.append(f"  ... {len(c.errors) - 8} more")
    if not c.errors and c.log:
        lines.append(_details_tail(c.log, 20))
    return "\n".join(lines)


def verify_text(v: VerifyResult, compile_result: CompileResult | None = None) -> str:
    if v.failure is FailureCategory.COMPILE_ERROR and compile_result is not None and not compile_result.ok:
        return "VERIFY FAILED (compile error):\n" + compile_text(compile_result)
    if v.ok:
        n = len([c for c in v.checks if c.max_abs_err is not None or c.name.startswith("input")]) or len(v.checks)
        errs = [c.max_abs_err for c in v.checks if c.max_abs_err is not None]
        tol = v.metadata.get("atol"), v.metadata.get("rtol")
        parts = [f"VERIFY PASSED: {v.message}" if v.message else f"VERIFY PASSED ({n} checks)"]
        extra = []
        if errs and "max abs err" not in (v.message or ""):
            extra.append(f"max abs err {_fmt_err(max(errs))}")
        if tol[0] is not None and "atol" not in (v.message or ""):
            extra.append(f"atol={tol[0]:g} rtol={tol[1]:g}" if tol[1] is not None else f"atol={tol[0]:g}")
        if extra:
            parts.append(" (" + ", ".join(extra) + ")")
        return "".join(parts)
    head = f"VERIFY FAILED ({v.failure.value.replace('_', ' ')}): "
    msg = v.message.strip()
    failing = [c for c in v.checks if not c.passed]
    if not msg and failing:
        c = failing[0]
        msg = f"{c.name}: {c.message or ''} {c.where} max abs err {_fmt_err(c.max_abs_err)}".strip()
    lines = [head + (msg.splitlines()[0] if msg else "no details")]
    for extra in msg.splitlines()[1:6]:
        lines.append("  " + extra)
    for c in failing[1:4]:
        if c.message and c.message not in msg:
            lines.append(f"  {c.name}: {c.message}")
    tail = _details_tail(str(v.metadata.get("details", "")))
    if tail:
        lines.append("last output:")
        lines.append(tail)
    return "\n".join(lines)


def profile_text(p: ProfileResult, reward: RewardResult | None = None, verify: VerifyResult | None = None,
                 compile_result: CompileResult | None = None) -> str:
    if not p.ok:
        if verify is not None and not verify.ok:
            return verify_text(verify, compile_result) + "\nPROFILE SKIPPED: not timed until it verifies."
        msg = p.message.strip() or "no details"
        lines = [f"PROFILE FAILED ({p.failure.value.replace('_', ' ')}): {msg.splitlines()[0]}"]
        tail = _details_tail(str(p.metadata.get("details", "")))
        if tail:
            lines.append("last output:")
            lines.append(tail)
        return "\n".join(lines)
    parts = [f"eager {_ms(p.eager)}", f"torch.compile {_ms(p.compile)}", f"yours {_ms(p.candidate)}"]
    text = "PROFILE: " + ", ".join(parts)
    se, sc = p.speedup_vs_eager(), p.speedup_vs_compile()
    sp = []
    if se is not None:
        sp.append(f"{se:.2f}x vs eager")
    if sc is not None:
        sp.append(f"{sc:.2f}x vs compile")
    if sp:
        text += " -> " + ", ".join(sp)
    if reward is not None:
        text += f" (reward {reward.value:g})"
    return text


# --- HTTP over a Unix socket --------------------------------------------------------------


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str, service: "WorkspaceService"):
        self.service = service
        super().__init__(path, _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _UnixHTTPServer
    protocol_version = "HTTP/1.1"

    def address_string(self) -> str:  # Unix sockets have no peer address
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        return

    def _send(self, code: int, payload: dict) -> None:
        body = json.dumps(payload, default=str).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        if n <= 0:
            return {}
        try:
            data = json.loads(self.rfile.read(n) or b"{}")
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        svc = self.server.service
        path = self.path.split("?")[0].rstrip("/")
        if path == "/health":
            self._send(200, {"ok": True, "workspace": str(svc.root), "backend": svc.backend})
        elif path == "/history":
            self._send(200, {"ok": True, "history": [svc.summary(e) for e in svc.history]})
        else:
            self._send(404, {"ok": False, "text": f"unknown endpoint {path}", "exit_code": 2})

    def do_POST(self) -> None:  # noqa: N802
        svc = self.server.service
        path = self.path.split("?")[0].rstrip("/").lstrip("/")
        body = self._body()
        if path not in ("compile", "verify", "profile", "evaluate"):
            self._send(404, {"ok": False, "text": f"unknown endpoint /{path}", "exit_code": 2})
            return
        try:
            payload = svc.handle(path, fresh=bool(body.get("fresh")))
            self._send(200, payload)
        except Exception as exc:  # a bug must reach the agent as one line, not a dead socket
            svc._log_error(exc)
            self._send(500, {"ok": False, "exit_code": 2,
                             "text": f"ERROR: the workspace service failed: {type(exc).__name__}: {exc}"})


# --- the service ----------------------------------------------------------------------------


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
        self._check_job_options()
        self.compiler = self._make_compiler(compiler)
        self._own_executor = executor is None
        self.executor = executor if executor is not None else self._default_executor()
        self.reward = self._make_reward(reward)
        self.on_result = on_result
        self.context: dict[str, Any] = {}  # merged into each history entry (e.g. the agent turn)
        self.history: list[dict] = []
        self.state_dir = self.root / STATE_DIR
        self.socket_path = Path(socket_path) if socket_path else self.state_dir / SOCKET_NAME
        self._compile_pool = compile_executor
        self._own_compile_pool = False
        self._lock = threading.RLock()
        self._server: _UnixHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._bound_path: str | None = None
        self._cache: dict[str, dict[str, Any]] = {}
        self._seq = 0
        self.errors: list[str] = []

    # -- construction helpers -----------------------------------------------------------

    def _check_job_options(self) -> None:
        """Unknown verify/profile options are a config error now, not a failed job later."""
        o = self.options
        prefix = "cuda_agent.sandbox.judge.tasks:"
        checks = [("verify_options", o.verify_job, "VerifyOptions", o.verify_options),
                  ("profile_options", o.profile_job, "ProfileOptions", o.profile_options)]
        for key, job, cls_name, opts in checks:
            if not job.startswith(prefix) or not opts:
                continue
            try:
                from ..judge import jobs
            except ImportError:
                return
            from ..judge.tasks import build_options

            cls = getattr(jobs, cls_name, None)
            if cls is None or not dataclasses.is_dataclass(cls):
                continue
            try:
                build_options(cls, dict(opts))
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"service.{key}: {exc}") from None

    def _make_compiler(self, compiler: Any) -> Any:
        if compiler is None:
            compiler = getattr(self.workspace, "compiler", None)
        if compiler is None:
            compiler = "gxx" if self.backend == "cpu" else "cpp_extension"
        if isinstance(compiler, (str, dict)) or hasattr(compiler, "keys"):
            from cuda_agent.core.plugins import get_plugin_manager

            spec = {"name": compiler} if isinstance(compiler, str) else compiler
            return get_plugin_manager().create("compiler", spec, where="compiler")
        return compiler

    def _make_reward(self, reward: Any) -> Any:
        if reward is None:
            reward = {"name": "milestone"}
        if isinstance(reward, (str, dict)) or hasattr(reward, "keys"):
            from cuda_agent.core.plugins import get_plugin_manager

            spec = {"name": reward} if isinstance(reward, str) else reward
            return get_plugin_manager().create("reward", spec, where="reward")
        return reward

    def _default_executor(self) -> Any:
        from ..executors.local import CpuExecutor, LocalExecutor

        if self.backend == "cpu":
            return CpuExecutor()
        return LocalExecutor()

    def _compile_executor(self) -> Any:
        if self._compile_pool is None:
            remote = getattr(self.executor, "build_executor", None)
            remote = remote() if callable(remote) else None
            if remote is not None:  # the pool builds elsewhere (CPU nodes of a cluster); not ours to close
                self._compile_pool = remote
                return remote
            from ..executors.pool import DeviceSpec, WorkerPool

            self._compile_pool = WorkerPool(
                [DeviceSpec(label="compile", device="cpu")],
                name="compile",
                default_timeout=self.options.compile_timeout,
                recycle="never",
                spares=0,
                preload=[type(self.compiler).__module__],  # the toolchain is loaded before the first build
                memory_limit_mb=self.options.compile_memory_mb,
                start_timeout=120.0,
            )
            self._own_compile_pool = True
        return self._compile_pool

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> "WorkspaceService":
        """Bind the socket and serve in a background thread; start the executor's workers."""
        if self._server is not None:
            return self
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = str(self.socket_path)
        if os.path.lexists(path):
            os.unlink(path)
        bind_path = path
        dir_fd = None
        if len(path) >= _MAX_UNIX_PATH:  # too long for sun_path
            if os.path.isdir("/proc/self/fd"):  # bind through the folder's descriptor: same file, short name
                dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
                bind_path = f"/proc/self/fd/{dir_fd}/{os.path.basename(path)}"
            else:  # bind in the temp folder and link from the workspace
                fd, bind_path = tempfile.mkstemp(prefix="cuda-agent-", suffix=".sock")
                os.close(fd)
                os.unlink(bind_path)
        try:
            self._server = _UnixHTTPServer(bind_path, self)
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        if dir_fd is not None:
            bind_path = path
        os.chmod(bind_path, 0o666)
        if bind_path != path:
            os.symlink(bind_path, path)
        self._bound_path = bind_path
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"service-{self.root.name}", daemon=True)
        self._thread.start()
        start = getattr(self.executor, "start", None)
        if callable(start):
            start()
        if self.options.compile_in == "worker":
            self._compile_executor()
        return self

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        for p in {str(self.socket_path), self._bound_path or ""}:
            if p and os.path.lexists(p):
                try:
                    os.unlink(p)
                except OSError:
                    pass
        if self._own_compile_pool and self._compile_pool is not None:
            self._compile_pool.close()
            self._compile_pool = None
        if self._own_executor and self.executor is not None:
            self.executor.close()

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
        """Build a private copy of the sources (see :mod:`.frozen`) into the workspace's
        build folder."""
        with frozen_sources(self.root) as src:
            return name_workspace(self._build(src), src, self.root)

    def _build(self, src: Path) -> CompileResult:
        t0 = time.monotonic()
        build_dir = self.state_dir / "build"
        if self.options.compile_in == "inline":
            try:
                return self.compiler.build(src, build_dir)
            except CudaAgentError as exc:
                return CompileResult(ok=False, errors=[exc.one_line()], seconds=time.monotonic() - t0)
        job = Job("cuda_agent.sandbox.workspace.service:compile_job",
                  {"compiler": self.compiler, "workspace": str(src), "build_dir": str(build_dir)},
                  kind="compile", timeout=self.options.compile_timeout, pass_device=False)
        try:
            return self._compile_executor().submit(job).result()
        except JobError as exc:
            if exc.reason == "invalid":  # the compiler object cannot travel to a worker: build here
                try:
                    return self.compiler.build(src, build_dir)
                except CudaAgentError as err:
                    return CompileResult(ok=False, errors=[err.one_line()], seconds=time.monotonic() - t0)
            if exc.reason == "timeout":
                msg = f"compile {exc.message} (a template or loop too large to build?)"
            elif exc.reason == "oom":
                msg = f"compile ran out of memory (limit {self.options.compile_memory_mb} MB)"
            else:
                msg = f"compiler failed: {exc.message}"
            return CompileResult(ok=False, errors=[msg], log=exc.details[-4000:], seconds=time.monotonic() - t0)

    def _run_job(self, kind: str, fn: str, options: dict, timeout: float) -> Any:
        job = Job(fn, {"workspace": str(self.root), "options": dict(options)}, kind=kind, timeout=timeout,
                  label=self.root.name)
        return self.executor.submit(job).result()

    def _verify(self, c: CompileResult) -> VerifyResult:
        if not c.ok:
            first = c.errors[0] if c.errors else "see the compile log"
            return VerifyResult(ok=False, failure=FailureCategory.COMPILE_ERROR, message=f"compile failed: {first}")
        t0 = time.monotonic()
        try:
            return self._run_job("verify", self.options.verify_job, self.options.verify_options,
                                 self.options.verify_timeout)
        except JobError as exc:
            return VerifyResult(ok=False, failure=exc.failure, message=exc.message,
                                seconds=time.monotonic() - t0,
                                metadata={"reason": exc.reason, "device": exc.device, "details": exc.details[-3000:]})

    def _profile(self) -> ProfileResult:
        t0 = time.monotonic()
        try:
            return self._run_job("profile", self.options.profile_job, self.options.profile_options,
                                 self.options.profile_timeout)
        except JobError as exc:
            return ProfileResult(ok=False, failure=exc.failure, message=exc.message,
                                 seconds=time.monotonic() - t0,
                                 metadata={"reason": exc.reason, "device": exc.device, "details": exc.details[-3000:]})

    def _evaluate_job(self) -> tuple[VerifyResult, ProfileResult | None] | None:
        """Verify + profile as one job; None when it did not return (then two jobs tell
        which step failed)."""
        o = self.options
        job = Job(o.evaluate_job, {"workspace": str(self.root), "verify_options": dict(o.verify_options),
                                   "profile_options": dict(o.profile_options)},
                  kind="evaluate", timeout=o.verify_timeout + o.profile_timeout, label=self.root.name)
        try:
            v, p = self.executor.submit(job).result()
        except JobError:
            return None
        return v, p

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
        c = self._compile()
        outcome = CandidateOutcome(compile=c)
        reused: list[str] = []
        want_verify = kind == "verify" or kind == "evaluate" or self.options.profile_verifies
        want_profile = kind in ("profile", "evaluate")
        cached_v = c.ok and cached and cached.get("verify") is not None and cached["verify"].ok
        if want_verify and want_profile and c.ok and not cached_v and self.options.evaluate_job:
            both = self._evaluate_job()
            if both is not None:
                outcome.verify, outcome.profile = both
                want_verify = want_profile = False
        if want_verify:
            if cached_v:
                outcome.verify = cached["verify"]
                reused.append("verify")
            else:
                outcome.verify = self._verify(c)
        if want_profile and c.ok and (outcome.verify is None or outcome.verify.ok):
            if cached and cached.get("profile") is not None and cached["profile"].ok:
                outcome.profile = cached["profile"]
                reused.append("profile")
            else:
                outcome.profile = self._profile()
        return outcome, reused

    def _record(self, kind: str, t0: float, files: dict[str, str], key: str, outcome: CandidateOutcome,
                reused: list[str], report: bool = True) -> dict:
        """Score ``outcome``, keep it in the history and report it to ``on_result`` (unless
        not ``report``: a run whose files changed under it says nothing of ``files``)."""
        reward = None
        try:
            reward = self.reward.score(outcome) if self.reward is not None else None
        except Exception as exc:
            self._log_error(exc)
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
                self._log_error(exc)
        return entry

    # -- HTTP glue ---------------------------------------------------------------------------

    def handle(self, endpoint: str, fresh: bool = False) -> dict:
        """Serve one tool request: JSON with ``text`` for the agent and the raw ``result``."""
        if endpoint == "compile":
            c = self.compile()
            return {"ok": c.ok, "kind": "compile", "exit_code": 0 if c.ok else 1,
                    "text": compile_text(c), "result": to_jsonable(c)}
        entry = self._request(endpoint, fresh)
        out: CandidateOutcome = entry["outcome"]
        reward: RewardResult | None = entry["reward"]
        if endpoint == "verify":
            v = out.verify
            ok = bool(v and v.ok)
            text = verify_text(v, out.compile) if v is not None else "VERIFY FAILED: nothing was verified"
            result = to_jsonable(v)
        else:
            p = out.profile
            ok = bool(p is not None and p.ok and (out.verify is None or out.verify.ok))
            if p is None:
                text = profile_text(ProfileResult(ok=False, failure=out.failure), None, out.verify, out.compile)
            else:
                text = profile_text(p, reward, out.verify, out.compile)
            if endpoint == "evaluate" and out.verify is not None and out.verify.ok:
                text = verify_text(out.verify) + "\n" + text
            result = to_jsonable(out)
        if "verify" in entry["reused"] or "profile" in entry["reused"]:
            text += "\n(files unchanged since the last run: result reused)"
        return {"ok": ok, "kind": endpoint, "exit_code": 0 if ok else 1, "text": text, "result": result,
                "reward": to_jsonable(reward) if reward is not None else None}

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
            self._log_error(exc)

    def _log_error(self, exc: BaseException) -> None:
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


def connect(socket_path: str | Path, timeout: float = 3600.0) -> socket.socket:
    """A socket connected to a service (handles paths longer than sun_path)."""
    path = str(socket_path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    if len(path) >= _MAX_UNIX_PATH:
        target = os.path.realpath(path)
        if len(target) < _MAX_UNIX_PATH:
            s.connect(target)
        else:
            dir_fd = os.open(os.path.dirname(target), os.O_RDONLY)
            try:
                s.connect(f"/proc/self/fd/{dir_fd}/{os.path.basename(target)}")
            finally:
                os.close(dir_fd)
    else:
        s.connect(path)
    return s
