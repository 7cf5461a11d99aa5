"""A Ray cluster of several nodes on this machine, for tests and measurements.

Each node is a ``ray start --block`` process of its own on a loopback address of its own
(head 127.0.0.2, then 127.0.0.3, ...), with the resources it is given (a custom resource
standing in for GPU slots, or the machine's GPUs), a small object store and its own ports.
:meth:`LocalCluster.stop` ends exactly the processes these commands started (each node's
process tree, by PID), never other Ray processes of the machine; :meth:`Node.kill_raylet`
kills one node's raylet, which is how a node is lost.

``fast_failure_detection`` makes the head declare a silent node dead after about 1.5 s
(instead of Ray's default of about 15 s).

The cluster depends on nothing the user's home or environment holds: its nodes run with a
home folder of their own under the cluster's temporary folder, no ``RAY_ADDRESS`` and no
token from the user (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN*``), and token authentication
off (``RAY_AUTH_MODE=disabled``: the nodes listen on loopback addresses only). Its clients
get the same settings from :attr:`LocalCluster.client_env`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

FAST_FAILURE = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_timeout_ms": 500}
READY_LINE = "will now block forever"
# the user's Ray settings that would reach the cluster's nodes through the environment
_USER_RAY_SETTINGS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")  # RAY_AUTH_TOKEN_PATH too


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int, taken: Iterable[int] = ()) -> list[int]:
    """``n`` distinct free ports, none of them in ``taken``. Each stays bound until all are
    picked: a port given back between two calls is often handed out again, and Ray refuses to
    start a node whose components were given the same port."""
    taken = set(taken)
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
            if p not in taken:
                ports.append(p)
    finally:
        for s in socks:
            s.close()
    return ports


def _ray_cli() -> list[str]:
    exe = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    if exe:
        return [exe]
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


@dataclass
class Node:
    ip: str
    proc: subprocess.Popen
    log: Path
    resources: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def processes(self) -> list:
        import psutil

        try:
            p = psutil.Process(self.proc.pid)
            return [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def raylet_pid(self) -> int | None:
        for p in self.processes():
            try:
                if p.name() == "raylet":
                    return p.pid
            except Exception:  # noqa: BLE001 - ended meanwhile
                continue
        return None

    def kill_raylet(self) -> int:
        pid = self.raylet_pid()
        if pid is None:
            raise RuntimeError(f"node {self.ip} has no raylet process")
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self) -> None:
        import psutil

        procs = self.processes()
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class LocalCluster:
    """See the module docstring. ``head_resources``/``head_cpus``/``head_gpus`` shape the head."""

    def __init__(self, head_resources: dict | None = None, head_cpus: int = 1, head_gpus: int | None = None,
                 object_store_mb: int = 200, fast_failure_detection: bool = True, start_timeout: float = 90.0):
        # short: Ray's socket paths live under it and must fit a Unix socket address
        self.root = Path(tempfile.mkdtemp(prefix="rayc-", dir="/tmp" if os.path.isdir("/tmp") else None))
        self._worker_base = random.randrange(20000, 50000, 1000)
        # ports handed to this cluster's nodes, worker port ranges included: never handed out twice
        self._ports = set(range(self._worker_base, self._worker_base + 200 * 16))
        self.port = free_ports(1, self._ports)[0]
        self._ports.add(self.port)
        self.object_store = object_store_mb * 1_000_000
        self.fast = fast_failure_detection
        self.start_timeout = start_timeout
        self.nodes: list[Node] = []
        self._next_ip = 2
        self.home = self.root / "home"
        self.home.mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(_USER_RAY_SETTINGS)}
        self.env.update(HOME=str(self.home), RAY_USAGE_STATS_ENABLED="0", **self.client_env)
        self._head = dict(resources=head_resources or {}, cpus=head_cpus, gpus=head_gpus)

    @property
    def client_env(self) -> dict[str, str]:
        """What a process connecting to this cluster must have in its environment (and nothing
        of :data:`_USER_RAY_SETTINGS` besides)."""
        return {"RAY_AUTH_MODE": "disabled"}

    @property
    def address(self) -> str:
        return f"127.0.0.2:{self.port}"

    @property
    def head_ip(self) -> str:
        return "127.0.0.2"

    def start(self) -> "LocalCluster":
        try:
            self._start_node(head=True, **self._head)
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(self, resources: dict | None = None, cpus: int = 1, gpus: int | None = None) -> Node:
        return self._start_node(head=False, resources=resources or {}, cpus=cpus, gpus=gpus)

    def _start_node(self, head: bool, resources: dict, cpus: int, gpus: int | None) -> Node:
        ip = f"127.0.0.{self._next_ip}"
        k = self._next_ip - 2
        self._next_ip += 1
        lo = self._worker_base + 200 * k
        agent_port, client_port = free_ports(2, self._ports)
        self._ports.update((agent_port, client_port))
        argv = [*_ray_cli(), "start", "--block", "--node-ip-address", ip, "--num-cpus", str(cpus),
                "--object-store-memory", str(self.object_store), "--resources", json.dumps(resources),
                "--dashboard-agent-listen-port", str(agent_port), "--min-worker-port", str(lo),
                "--max-worker-port", str(lo + 199), "--disable-usage-stats"]
        if gpus is not None:
            argv += ["--num-gpus", str(gpus)]
        if head:
            argv += ["--head", "--port", str(self.port), "--include-dashboard", "false", "--temp-dir", str(self.root),
                     "--ray-client-server-port", str(client_port)]
            if self.fast:
                argv += ["--system-config", json.dumps(FAST_FAILURE)]
        else:
            argv += ["--address", self.address]
        log = self.root / f"node-{ip}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env, start_new_session=True)
        node = Node(ip=ip, proc=proc, log=log, resources=dict(resources))
        self.nodes.append(node)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if READY_LINE in text:
                return node
            if proc.poll() is not None:
                tail = "\n".join(text.splitlines()[-15:])
                raise RuntimeError(f"ray start for node {ip} exited with {proc.returncode}:\n{tail}")
            time.sleep(0.2)
        raise RuntimeError(f"ray start for node {ip} did not come up within {self.start_timeout:.0f} s")

    def stop(self) -> None:
        """End every process the nodes' commands started (worker nodes first), by PID."""
        for node in reversed(self.nodes):
            node.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
