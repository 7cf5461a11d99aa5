"""The trusted side's handle on a candidate process (:mod:`.candidate`).

:class:`CandidateProcess` starts the process (as the first of a PID namespace of its own
where it can; :mod:`.identity`), sends it commands with deadlines and reads its answers
(JSON; outputs rebuilt by :mod:`.tensors` into this process's memory). :meth:`close` ends
it and, when it ran under a job's own user id, kills every process of that id and checks
that none is left.

An executor worker starts one ahead of its first job (:func:`prestart`, a worker init
step), so that the candidate process's imports, CUDA context and identity cost no job any
time: it is *warmed* (:meth:`CandidateProcess.warm`) into the next job's own user id (leased
then, for that job alone), its own mount and network namespaces and private ``/tmp``, with
one folder of the host bound into its view: the job's inbox, empty until the job's files are
copied into it (:mod:`.session` takes its snapshot there). A job takes it with
:func:`claim` (or :func:`obtain`). A worker whose candidate process served a job serves no
other (:func:`after_job`): the next job gets a fresh pair, and a process of that job's user
never outlives its job (:meth:`CandidateProcess.close`).

A GPU worker also forks a *standby* before its CUDA context (:func:`standby_for`): its imports
done, it waits with no CUDA context and no candidate code for a job that ends its first
candidate process and needs another (a job that measures baselines after verification). A
process the worker started then, with a CUDA context of its own, could not be forked, and
starting one anew cost 4-7 s of the GPU slot.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from functools import partial
from pathlib import Path
from typing import Any

from cuda_agent.core.errors import CudaAgentError

from . import identity, wire
from .tensors import close_all as _close

START_TIMEOUT = 180.0
# the metadata key of a result whose candidate process was ended by a SIGKILL the judge did
# not send (see CandidateProcess._died); the pipeline runs such a job once more
KILLED_OUTSIDE = "candidate_killed_outside"


class CandidateProcessError(CudaAgentError):
    """The candidate process died, hung or broke the protocol. ``reason``: ``crash``,
    ``timeout`` or ``protocol``."""

    def __init__(self, message: str, reason: str = "crash", killed_outside: str = ""):
        super().__init__(message)
        self.reason = reason
        self.killed_outside = killed_outside  # why the end was not the candidate's doing, as far as seen


class CandidateProcess:
    def __init__(self, device: str = "cpu", start_timeout: float = START_TIMEOUT, standby: bool = False):
        self.device = str(device)
        # a standby imports and then waits for :meth:`activate` before it makes its CUDA
        # context (a worker forks it ahead, while it has no context of its own; see standby_for)
        self.standby = standby
        self._activated = not standby
        self.identity: identity.JobIdentity | None = None
        self.isolation: dict[str, Any] = {}
        self.used = False
        self.claimed = False  # taken by a job's session (which then removes the inbox)
        self.closed = False
        self.swept = 0
        self._log = tempfile.NamedTemporaryFile(prefix="cuda-agent-candidate-", suffix=".log", delete=False)
        self._ready: dict | None = None
        self._start_timeout = start_timeout
        self.inbox: Path | None = None  # the folder the next job's files go into (see warm)
        self.warmed: dict | None = None  # what the drop ahead of the job reported
        self.warm_error = ""
        self._warming: threading.Thread | None = None
        self._spawn(identity.pidns_wanted(self.device))

    def _spawn(self, pidns: bool) -> None:
        self.killed_by_judge = False  # set when this side ends the process (kill, close)
        self._oom_kills = host_oom_kills()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock = ours
        cfg = {"fd": theirs.fileno(), "device": self.device, "standby": not self._activated}
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.pop("CUDA_AGENT_JOB_PROCESS", None)
        try:
            why_not = _why_not_fork()
            if not why_not:
                self.proc, how = identity.fork(partial(_candidate_main, cfg), pidns=pidns,
                                               output_fd=self._log.fileno(), keep_fds=(theirs.fileno(),), env=env)
            else:
                self.proc, how = identity.spawn(
                    [sys.executable, "-m", "cuda_agent.sandbox.judge.candidate", json.dumps(cfg)], pidns=pidns,
                    stdin=_devnull(), stdout=self._log, stderr=self._log, pass_fds=(theirs.fileno(),),
                    close_fds=True, env=env)
        finally:
            theirs.close()
        self.isolation["started"] = "forked from the job's worker" if not why_not else f"started anew ({why_not})"
        self.isolation["pid_namespace"] = how
        self._pidns = how == "own PID namespace"

    # -- the process ----------------------------------------------------------------

    def activate(self) -> None:
        """A standby goes on with its start: it makes its CUDA context (under the device's
        quiet lock) and says it is ready; nothing for a process that was no standby."""
        if self._activated or self.closed:
            return
        self._activated = True
        try:
            wire.send(self.sock, {"op": "start"})
        except OSError:
            raise self._died() from None

    def wait_ready(self) -> None:
        if self._ready is not None:
            return
        self.activate()
        msg, fds = self._recv(self._start_timeout, "start")
        _close(fds)
        if msg.get("op") != "ready" and self._pidns and (msg.get("error") or {}).get("cuda_init"):
            # the GPU's driver does not start CUDA in a PID namespace of its own here: the
            # host's namespace from now on (the sweep of the job's user still ends its processes)
            why = str((msg.get("error") or {}).get("message", ""))[:200]
            identity.pidns_refused(self.device, why)
            self.kill()
            self.sock.close()
            if threading.current_thread() is not threading.main_thread():
                # a process forked here would die with this thread (its parent-death signal
                # follows the forking thread): the job starts its own, outside a PID namespace
                raise CandidateProcessError(f"CUDA does not start in a PID namespace of its own here ({why})")
            self._spawn(False)
            self.isolation["pid_namespace"] = f"host PID namespace (CUDA does not start in one of its own here: {why})"
            msg, fds = self._recv(self._start_timeout, "start")
            _close(fds)
        if msg.get("op") != "ready":
            err = (msg.get("error") or {}).get("message", "")
            self.close()
            raise CandidateProcessError(f"the candidate process failed to start: {err or msg}")
        self._ready = msg

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 12) -> str:
        try:
            with open(self._log.name, "rb") as fh:
                data = fh.read()[-8000:]
        except OSError:
            return ""
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    def _died(self) -> CandidateProcessError:
        from ..executors.job import describe_exit

        try:
            self.proc.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass
        rc = self.proc.poll()
        last = [ln for ln in self.tail(6).splitlines() if ln.strip()]
        why = describe_exit(rc) if rc is not None else "crashed: closed its channel"
        outside = ""
        if rc == -signal.SIGKILL and not self.killed_by_judge:
            oom = host_oom_kills()
            outside = "the judge did not send that SIGKILL (" + (
                "the host's out-of-memory killer ran meanwhile)" if oom > self._oom_kills >= 0 else
                "the host's out-of-memory killer, an operator or the candidate itself did)")
        return CandidateProcessError(f"the candidate process {why}" + (f"; {outside}" if outside else "")
                                     + (f"; it printed: {last[-1][:300]}" if last else ""), killed_outside=outside)

    def _recv(self, timeout: float | None, what: str) -> tuple[dict, list[int]]:
        try:
            return wire.recv(self.sock, timeout)
        except wire.WireError as exc:
            if exc.reason == "timeout":
                self.kill()
                raise CandidateProcessError(f"the candidate process did not finish {what} within {timeout:g} s",
                                            "timeout") from None
            if exc.reason == "closed":
                raise self._died() from None
            self.kill()
            raise CandidateProcessError(f"the candidate process broke the protocol ({exc})", "protocol") from None
        except OSError:
            raise self._died() from None

    def call(self, msg: dict, timeout: float | None = None) -> tuple[dict, list[int]]:
        """Send a command; its reply and the descriptors that came with it (closed by the
        caller, e.g. through :func:`tensors.close_all`)."""
        self.wait_ready()
        if self.closed:
            raise CandidateProcessError("the candidate process is closed")
        self.used = True
        try:
            wire.send(self.sock, msg)
        except OSError:
            raise self._died() from None
        return self._recv(timeout, f"command {msg.get('op')!r}")

    def request(self, msg: dict, timeout: float | None = None) -> dict:
        reply, fds = self.call(msg, timeout)
        _close(fds)
        return reply

    # -- identity ---------------------------------------------------------------------

    def warm(self, background: bool = False) -> None:
        """Become the next job's, before there is one: lease its user id, make its inbox (an
        empty folder of root's that the job's files will be copied into) and drop into it
        (:meth:`drop`: the user id, own mount and network namespaces, private ``/tmp``).
        No candidate code has run here, and none runs before the job's ``load``. With
        ``background``, in a thread (:meth:`wait_warm` waits for it)."""
        if self.inbox is None:  # now: a job may take the process (and copy its files) at once
            self.inbox = Path(tempfile.mkdtemp(prefix="cuda-agent-next-job-"))
            os.chmod(self.inbox, 0o755)
        if background:
            self._warming = threading.Thread(target=self._warm_drop, name="candidate-warm", daemon=True)
            self._warming.start()
        else:
            self._warm_drop()

    def _warm_drop(self) -> None:
        try:
            self.wait_ready()
            self.warmed = self.drop(str(self.inbox), True)
        except Exception as exc:  # noqa: BLE001 - the job then gets a process started for it
            self.warm_error = f"{type(exc).__name__}: {exc}"[:300]
            self.warmed = None

    def wait_warm(self) -> bool:
        """Wait for a warm-up in progress; whether the process is warm and alive."""
        t = self._warming
        if t is not None:
            t.join()
            self._warming = None
        return self.warmed is not None and not self.closed and self.alive()

    def drop(self, workspace: str, enabled: bool = True, timeout: float = 60.0, prebuilt: dict | None = None) -> dict:
        """Make the process the job's own user (when this process is root and the drop is on);
        ``prebuilt``: ``{"prebuilt": folder, "arch": ...}`` of extensions built ahead (:mod:`.prebuild`).
        A process warmed ahead of its job (:meth:`warm`) is that user already: the job's
        ``workspace`` (in its inbox) and extensions are only handed to it."""
        from ..isolation import privdrop

        uid = None
        if self.warmed is not None:
            uid = self.identity.uid if self.identity is not None else None
        elif enabled and os.geteuid() == 0 and sys.platform.startswith("linux") and not privdrop.switched_off():
            self.identity = identity.JobIdentity()
            uid = self.identity.uid
            if self.identity.leftover_before:
                self.isolation["killed_before_start"] = self.identity.leftover_before
        reply = self.request({"op": "drop", "workspace": workspace, "enabled": enabled, "uid": uid, **(prebuilt or {})},
                             timeout)
        if not reply.get("ok"):
            raise CandidateProcessError(f"the candidate process could not give up its rights: {reply.get('error')}")
        meta = reply.get("meta") if isinstance(reply.get("meta"), dict) else {}
        if uid is not None and meta.get("uid") != uid:
            self.kill()
            raise CandidateProcessError("the candidate process did not become the job's user", "protocol")
        return {k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool))}

    # -- the end ----------------------------------------------------------------------

    def kill(self) -> None:
        from ..isolation.sandboxes.sweeps import reap

        self.killed_by_judge = True
        reap(self.proc)

    def close(self) -> dict:
        """End the process and every process of the job's user; what the end found."""
        if self.closed:
            return self.isolation
        self.closed = True
        # killed, not asked to exit: nothing of the job is kept in this process, and
        # Python's own exit with torch loaded takes seconds
        self.kill()
        if self._warming is not None:  # ends at once with the process (its user is swept below)
            self._warming.join(timeout=self._start_timeout)
        try:
            self.sock.close()
        except OSError:
            pass
        if self.identity is not None:
            try:
                self.swept = identity.sweep(self.identity.uid)
                left = identity.processes_of(self.identity.uid)
                self.isolation["left_running_killed"] = self.swept
                self.isolation["left_running_after_end"] = len(left)
            finally:
                self.identity.release()
        try:
            os.unlink(self._log.name)
        except OSError:
            pass
        self._log.close()
        if self.inbox is not None and not self.claimed:  # a job's inbox goes with its session
            shutil.rmtree(self.inbox, ignore_errors=True)
        return self.isolation


def _candidate_main(cfg: dict) -> int:
    """The forked candidate process's program: as ``python -m cuda_agent.sandbox.judge.candidate``
    (the entry point is its ``__main__``, its command line only that config)."""
    from . import candidate

    sys.modules["__main__"] = candidate
    sys.argv = [candidate.__file__, json.dumps(cfg)]
    return candidate.main([json.dumps(cfg)])


FORK_ENV = "CUDA_AGENT_CANDIDATE_FORK"  # "0": candidate processes start anew, never forked
_QUIET_THREADS = {"parent-watch"}  # the worker's own threads, which hold no lock a child needs


def _why_not_fork() -> str:
    """Why this process must start its candidate process anew rather than fork it; "" when a
    fork is safe. A fork copies this process: it is done only in a job's worker process
    (which holds nothing of a job before its job comes) that has made no CUDA context
    (a child cannot use its parent's) and runs no thread but its own watch."""
    if os.environ.get(FORK_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return "switched off"
    if os.environ.get("CUDA_AGENT_JOB_PROCESS") != str(os.getpid()):
        return "not a job's worker process"
    torch = sys.modules.get("torch")
    if torch is None:
        return "torch is not imported here"
    if torch.cuda.is_initialized():
        return "this process has a CUDA context"
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.name not in _QUIET_THREADS]
    if others:
        return f"threads running: {', '.join(sorted(others)[:3])}"
    return ""


def host_oom_kills() -> int:
    """How many processes the kernel's out-of-memory killer has ended on this host since it
    started (``oom_kill`` in /proc/vmstat; -1 where that is not known)."""
    try:
        with open("/proc/vmstat") as fh:
            for line in fh:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return -1


def _devnull() -> Any:
    return open(os.devnull, "rb")


# --- one per worker, started ahead of its first job ---------------------------------------------

_prestarted: CandidateProcess | None = None
_standby: CandidateProcess | None = None  # a second one, for a job that needs a new process
_spent = False


def prestart(device: str = "cpu") -> None:
    """A worker init step: start this worker's candidate process now and warm it for the
    next job (:meth:`CandidateProcess.warm`: imports, CUDA context, the job's user id and
    namespaces, all while the worker waits as a spare). On a GPU the worker waits for the
    process to be ready (it makes its CUDA context under the device's quiet lock, so no
    context is made while a timing runs there; its imports take no lock); the drop ahead of
    the job then runs alongside the worker."""
    global _prestarted, _standby
    if _prestarted is None:
        _prestarted = CandidateProcess(device)
        if str(device).startswith("cuda") and _standby is None:
            # forked now, before this worker's CUDA context and the warming thread: a job that
            # ends its candidate process and needs a new one (see standby_for) takes it
            _standby = CandidateProcess(device, standby=True)
        if str(device).startswith("cuda"):
            _prestarted.wait_ready()
        _prestarted.warm(background=True)


def claim(device: str, drop: bool = True) -> CandidateProcess | None:
    """The prestarted candidate process for a job on ``device`` that drops its rights
    (``drop``), now this job's (its inbox known at once; it may still be warming:
    :meth:`CandidateProcess.wait_warm`); None when there is none that fits (the one there
    is, if any, is ended: a worker's candidate process serves one job)."""
    global _prestarted, _spent
    _spent = True
    p, _prestarted = _prestarted, None
    if p is None:
        return None
    if drop and p.device == str(device) and p.inbox is not None and not p.closed and p.alive():
        p.claimed = True
        return p
    p.close()
    return None


def standby_for(device: str) -> CandidateProcess | None:
    """This worker's standby candidate process for a job on ``device`` that needs a second
    process (a job that ended its first to measure baselines), now that job's: forked when
    the worker started, its imports done, no CUDA context and no candidate code yet. It is
    activated here, so that its CUDA context is made while the job does other work (the
    context waits for the device's quiet lock: never while a timing runs). None when there
    is none that fits (it is then ended)."""
    global _standby
    p, _standby = _standby, None
    if p is None:
        return None
    if p.device == str(device) and not p.closed and p.alive():
        try:
            p.activate()
            return p
        except CandidateProcessError:
            pass
    p.close()
    return None


def after_job() -> str | None:
    """The reason this worker must not serve another job (its candidate process is spent)."""
    if _spent:
        return "the job's candidate process has ended; a fresh worker (and candidate process) serves the next job"
    return None


def shutdown() -> None:
    global _prestarted, _standby
    for p in (_prestarted, _standby):
        if p is not None:
            p.close()
    _prestarted = _standby = None
