"""A fork server for worker processes: modules imported once, a fresh process per worker.

Starting a worker with ``python -m ...`` pays for its imports every time (torch and
``torch._dynamo``: seconds of CPU per worker, and a pool with ``recycle=always`` starts one
per job). A :class:`ForkServer` is one process, started like a worker with the pool's
interpreter and environment, that imports the pool's preload modules once and then does
nothing but fork: each worker is a child forked from that clean image, which then runs
:func:`cuda_agent.sandbox.executors.worker.main` exactly as a started worker would (its
limits, init steps, CUDA context and candidate process are its own and made after the fork).

What a forked worker shares with the others is only what the server held before any
fork: imported modules. The server never makes a CUDA context, runs no init step and no
job, and holds no job's data; it is single-threaded (a fork copies no other thread).

Protocol (a ``SOCK_SEQPACKET`` pair; each message one JSON object, file descriptors
attached with ``SCM_RIGHTS``):

* server to pool: ``{"op": "ready"}`` once the modules are imported;
* pool to server: ``{"op": "fork", "id": N, "cfg": {...}}`` with two descriptors, the
  worker's output file and its end of the pool's socket; reply
  ``{"op": "forked", "id": N, "pid": P}`` (or ``"error"``);
* server to pool, at any time: ``{"op": "exit", "pid": P, "code": C}`` when a worker it
  forked ends (``C`` as ``subprocess`` gives it: negative for a signal).

The server ends when its socket closes or the pool's process is gone; its workers see
their parent change and end with it (:func:`cuda_agent.sandbox.executors.worker._watch_parent`).

Servers are shared within a process (:func:`acquire`, :func:`release`): pools of one process
with the same interpreter, environment, preload modules and import path take the same
server, and a server no pool uses waits ``$CUDA_AGENT_FORK_SERVER_LINGER`` seconds (default
120; 0: it ends with its last pool) for the next one, so a process that makes pools one after
another (an episode's, a test's) pays the imports once. Sharing hands a pool nothing of
another's: the server holds only imported modules, and every worker is a fresh fork.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import tempfile
import time
import traceback
import weakref

MAX_MESSAGE = 1 << 20


def _send(sock: socket.socket, msg: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


# --- the server process ----------------------------------------------------------------------


def _child(sock: socket.socket, sel: selectors.BaseSelector, wake: tuple[int, int], cfg: dict,
           fds: list[int]) -> None:
    """In the forked worker: become a worker of its own and never return."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        sel.close()
        sock.close()
        for fd in wake:
            os.close(fd)
        os.setsid()  # its own session and process group, as a started worker has
        log_fd, conn_fd = fds
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        env = cfg.pop("env", None)
        if env is not None:  # the worker's own environment, its device's variables included
            os.environ.clear()
            os.environ.update(env)
        cfg = dict(cfg, fd=conn_fd)
        if cfg.get("parent"):
            cfg["parent"] = os.getppid()  # the worker ends when this server does
        from cuda_agent.sandbox.executors import worker

        code = worker.main([json.dumps(cfg)])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the worker's log says why
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):
            _send(sock, {"op": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(argv[0])
    sock = socket.socket(fileno=int(cfg["fd"]))
    # ends with the pool's process by watching its parent id below, not by PR_SET_PDEATHSIG:
    # that signal comes when the *thread* that started this process ends, and a pool is often
    # started from a short-lived thread (the first job submitted from a client thread)
    parent = int(cfg.get("parent") or 0)
    if parent and os.getppid() != parent:
        return 1
    for extra in cfg.get("sys_path") or []:
        if extra not in sys.path:
            sys.path.append(extra)
    for mod in ["cuda_agent.sandbox.executors.worker", *(cfg.get("preload") or [])]:
        try:
            importlib.import_module(mod)
        except Exception as exc:  # the worker imports it again and reports the failure itself
            print(f"fork server: preloading {mod} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    for fn_path in cfg.get("init") or []:  # e.g. the plugin registry, loaded once for every worker
        try:
            mod_name, _, fn_name = fn_path.partition(":")
            getattr(importlib.import_module(mod_name), fn_name)()
        except Exception as exc:  # the worker runs its own init steps and reports their failures
            print(f"fork server: init {fn_path} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    if threading.active_count() != 1:  # a fork would copy the memory but not the threads
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        _send(sock, {"op": "error", "message": f"the preloaded modules started threads ({names})"})
        return 1
    wake = os.pipe()
    os.set_blocking(wake[1], False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake[1])
    _send(sock, {"op": "ready", "pid": os.getpid()})
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake[0], selectors.EVENT_READ)
    while True:
        for key, _ in sel.select(timeout=1.0):
            if key.fileobj is not sock:
                with contextlib.suppress(BlockingIOError, OSError):
                    os.read(wake[0], 4096)
                continue
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 4)
            except OSError:
                data, fds = b"", []
            if not data:
                return 0
            msg = json.loads(data)
            if msg.get("op") != "fork" or len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                _send(sock, {"op": "error", "id": msg.get("id"), "message": "a fork takes a config and two descriptors"})
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(sock, sel, wake, msg.get("cfg") or {}, fds)
            for fd in fds:
                os.close(fd)
            _send(sock, {"op": "forked", "id": msg.get("id"), "pid": pid})
        _reap(sock)
        if parent and os.getppid() != parent:
            return 1


# --- the pool's side --------------------------------------------------------------------------


class ForkServerError(RuntimeError):
    pass


class ForkedProcess:
    """A worker forked by a :class:`ForkServer`, with the parts of ``subprocess.Popen`` a
    pool uses: ``pid``, ``poll``, ``wait``, ``kill``, ``returncode``. The process is the
    server's child, so its exit code comes from the server's report."""

    def __init__(self, server: ForkServer, pid: int):
        self.server = server
        self.pid = pid
        self._code: int | None = None

    def poll(self) -> int | None:
        if self._code is None:
            self._code = self.server.exit_code(self.pid)
        return self._code

    @property
    def returncode(self) -> int | None:
        """The exit code; for a process that has just ended, after the server's report
        (a second at most)."""
        if self.poll() is None and not _exists(self.pid):
            self.server.wait_exit(self.pid, 1.0)
        return self.poll()

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
            if not self.server.alive():  # nobody reports its end any more
                if not _exists(self.pid):
                    return -1
            self.server.wait_exit(self.pid, 0.05)
        return self._code  # type: ignore[return-value]

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)


def _exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False


class ForkServer:
    """The pool's handle on one fork server process (see the module docstring)."""

    def __init__(self, *, python: str, env: dict[str, str], preload: list[str], sys_path: list[str], log_path: str,
                 init: list[str] | tuple[str, ...] = ()):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        cfg = {"fd": theirs.fileno(), "parent": os.getpid(), "preload": list(preload), "sys_path": list(sys_path),
               "init": list(init)}
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self._cond = threading.Condition()
        self._replies: dict[int, dict] = {}
        self._exits: dict[int, int] = {}
        self._ready: dict | None = None
        self._closed = False
        self._next = 0
        self.shared_key: str | None = None  # see acquire()
        try:
            self.proc = subprocess.Popen(
                [python, "-m", "cuda_agent.sandbox.executors.fork_server", json.dumps(cfg)],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),), start_new_session=True, env=env, close_fds=True)
        finally:
            theirs.close()
        self._reader = threading.Thread(target=self._read, name="fork-server-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            with self._cond:
                if not data:
                    self._closed = True
                    self._cond.notify_all()
                    return
                msg = json.loads(data)
                op = msg.get("op")
                if op == "ready":
                    self._ready = msg
                elif op == "exit":
                    self._exits[int(msg["pid"])] = int(msg["code"])
                elif msg.get("id") is not None:
                    self._replies[int(msg["id"])] = msg
                else:  # an error the server ends with
                    self._ready = msg
                self._cond.notify_all()

    def alive(self) -> bool:
        return not self._closed and self.proc.poll() is None

    def wait_ready(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._ready is not None or self._closed, timeout)
            if self._ready is not None and self._ready.get("op") == "ready":
                return
            why = (self._ready or {}).get("message") or ("it ended" if self._closed else f"not ready within {timeout:g} s")
        raise ForkServerError(f"the fork server did not start: {why}")

    def fork(self, cfg: dict, log_fd: int, conn_fd: int, timeout: float) -> ForkedProcess:
        """A new worker running ``cfg``; raises ForkServerError when the server cannot fork."""
        self.wait_ready(timeout)
        with self._cond:
            self._next += 1
            rid = self._next
            try:
                _send(self.sock, {"op": "fork", "id": rid, "cfg": cfg}, [log_fd, conn_fd])
            except OSError as exc:
                raise ForkServerError(f"the fork server is gone ({exc})") from None
            self._cond.wait_for(lambda: rid in self._replies or self._closed, timeout)
            reply = self._replies.pop(rid, None)
        if reply is None or reply.get("op") != "forked":
            raise ForkServerError(f"the fork server did not fork: {(reply or {}).get('message') or 'no reply'}")
        return ForkedProcess(self, int(reply["pid"]))

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            return self._exits.pop(pid, None)

    def wait_exit(self, pid: int, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self._closed, timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            self._log.close()


# --- servers shared by the pools of one process --------------------------------------------

LINGER_ENV = "CUDA_AGENT_FORK_SERVER_LINGER"
DEFAULT_LINGER_S = 120.0
KEY_IGNORES = frozenset({LINGER_ENV, "PYTEST_CURRENT_TEST"})
MAX_IDLE = 2  # servers that no pool uses, kept waiting at most (the oldest goes first)

_shared_lock = threading.Lock()
_shared: dict[str, ForkServer] = {}
_users: dict[int, int] = {}  # id(server) -> pools using it
_idle_since: dict[int, float] = {}
_timers: dict[int, threading.Timer] = {}
_log_dir: str | None = None


def linger_seconds() -> float:
    raw = os.environ.get(LINGER_ENV, "").strip()
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_LINGER_S
    except ValueError:
        return DEFAULT_LINGER_S


def _shared_log_dir() -> str:
    global _log_dir
    if _log_dir is None or not os.path.isdir(_log_dir):
        _log_dir = tempfile.mkdtemp(prefix=f"cuda-agent-fork-servers-{os.getpid()}-")
    return _log_dir


def acquire(*, python: str, env: dict[str, str], preload: list[str], sys_path: list[str],
            init: list[str] | tuple[str, ...] = ()) -> ForkServer:
    """This process's fork server for these settings, started when none is alive. ``init``:
    functions (``"module:function"``) the server runs once after its imports; they may start
    no thread and make no CUDA context (a server whose init started a thread refuses to fork)."""
    # variables no import reads, which change under a running process; a forked worker gets its
    # pool's whole environment anyway (see _child)
    keyed_env = {k: v for k, v in env.items() if k not in KEY_IGNORES}
    key = json.dumps([python, keyed_env, list(preload), list(sys_path), list(init)], sort_keys=True)
    with _shared_lock:
        server = _shared.get(key)
        if server is not None and not server.alive():
            _forget(key, server)
            stale, server = server, None
        else:
            stale = None
        if server is None:
            server = ForkServer(python=python, env=env, preload=preload, sys_path=sys_path, init=init,
                                log_path=os.path.join(_shared_log_dir(), f"fork-server-{len(os.listdir(_shared_log_dir()))}.log"))
            server.shared_key = key
            _shared[key] = server
        sid = id(server)
        _users[sid] = _users.get(sid, 0) + 1
        _idle_since.pop(sid, None)
        timer = _timers.pop(sid, None)
    if timer is not None:
        timer.cancel()
    if stale is not None:
        stale.close()
    return server


def release(server: ForkServer) -> None:
    """A pool is done with ``server``: it ends now, or after the linger if no pool takes it."""
    linger = linger_seconds()
    ended: list[ForkServer] = []
    with _shared_lock:
        sid = id(server)
        left = _users.get(sid, 0) - 1
        if left > 0:
            _users[sid] = left
            return
        _users.pop(sid, None)
        key = getattr(server, "shared_key", None)
        if linger <= 0 or not server.alive() or _shared.get(key) is not server:
            _forget(key, server)
            ended.append(server)
        else:
            _idle_since[sid] = time.monotonic()
            timer = threading.Timer(linger, _expire, args=(weakref.ref(server),))
            timer.daemon = True
            _timers[sid] = timer
            timer.start()
            idle = sorted((s for s in _shared.values() if id(s) in _idle_since), key=lambda s: _idle_since[id(s)])
            for old in idle[: max(0, len(idle) - MAX_IDLE)]:
                _forget(old.shared_key, old)
                ended.append(old)
    for s in ended:
        s.close()


def discard(server: ForkServer) -> None:
    """``server`` failed: no pool gets it again; it ends now."""
    with _shared_lock:
        _forget(getattr(server, "shared_key", None), server)
    server.close()


def _forget(key: str | None, server: ForkServer) -> None:
    if key is not None and _shared.get(key) is server:
        del _shared[key]
    sid = id(server)
    _idle_since.pop(sid, None)
    timer = _timers.pop(sid, None)
    if timer is not None:
        timer.cancel()


def _expire(ref: weakref.ref) -> None:
    server = ref()
    if server is None:
        return
    with _shared_lock:
        if _users.get(id(server), 0) > 0:
            return
        _forget(getattr(server, "shared_key", None), server)
    server.close()


def close_all() -> None:
    """End every shared server (at this process's exit)."""
    with _shared_lock:
        servers = list(_shared.values())
        for s in servers:
            _forget(s.shared_key, s)
        _users.clear()
    for s in servers:
        s.close()
    if _log_dir:
        import shutil

        shutil.rmtree(_log_dir, ignore_errors=True)


atexit.register(close_all)


if __name__ == "__main__":
    sys.exit(serve())
