"""Connecting to the Ray cluster and finding the pool's slots on it.

* :func:`connect` joins a cluster (``auto``, ``host:port``, ``ray://host:port``) or starts
  one in this process (empty address), once per process; :func:`release` ends a connection
  this module opened when its last user is done. A cluster started here uses token
  authentication with a token of its own, held in this process's environment while it runs
  (:func:`_private_token`): nothing is written to the user's home (Ray's default would leave
  ``~/.ray/auth_token``, which later clusters on the machine pick up). A token or
  ``RAY_AUTH_MODE`` the user set is used as it is.
* A *slot* is one GPU of a node (or, for the ``cpu`` backend, one unit of a custom
  resource): :func:`node_slots` counts them per live node, :func:`slot_name` names the
  slot actor of each, so every client of the cluster finds the same actor for the same
  slot (named actors in the pool's namespace).
* :func:`store_actor` finds or starts the baseline store on the head node.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Any

from cuda_agent.core.errors import ConfigError

from .baseline_store import STORE_NAME, BaselineStore

HEAD_RESOURCE = "node:__internal_head__"
_lock = threading.Lock()
_users = 0
_opened_here = False
_set_here: dict[str, str] = {}  # environment variables _private_token set, removed by release()


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"executor ray needs the ray package (pip install ray): {exc}") from None
    return ray


def connect(address: str, namespace: str, node_ip_address: str = "", local_resources: dict | None = None,
            local_gpus: int | None = None) -> Any:
    """``ray`` connected to the cluster (see the module docstring)."""
    global _users, _opened_here
    ray = import_ray()
    with _lock:
        if not ray.is_initialized():
            kw: dict[str, Any] = {"namespace": namespace, "log_to_driver": False, "logging_level": logging.WARNING,
                                  "ignore_reinit_error": True}
            if node_ip_address:
                kw["_node_ip_address"] = node_ip_address
            if address:
                check_reachable(address)
                target: str | None = address
            else:  # a cluster of this machine only, started here and ended with this process
                target = None
                kw["include_dashboard"] = False
                if local_resources:
                    kw["resources"] = dict(local_resources)
                if local_gpus is not None:
                    kw["num_gpus"] = local_gpus
                _private_token()
            try:
                ray.init(address=target, **kw)
            except ConnectionError as exc:
                _drop_private_token()
                raise ConfigError(
                    f"executor ray: no Ray cluster at {address!r} ({str(exc).splitlines()[0][:200]}); start one with "
                    "`ray start --head` or set executor.options.address") from None
            _opened_here = True
        _users += 1
    return ray


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """A one-line ConfigError unless ``host:port`` (or ``ray://host:port``) accepts a connection
    (Ray itself would keep retrying for minutes); ``auto`` is left to Ray."""
    import socket

    if address == "auto":
        return
    hostport = address.split("://", 1)[-1].rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"executor ray: address {address!r} is not auto, host:port or ray://host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(
            f"executor ray: no Ray cluster answers at {address} ({exc.strerror or exc}); start one with "
            "`ray start --head` or set executor.options.address") from None


def release() -> None:
    """One user of :func:`connect` is done; the last one ends a connection opened here."""
    global _users, _opened_here
    ray = import_ray()
    with _lock:
        _users = max(0, _users - 1)
        if _users == 0 and _opened_here and ray.is_initialized():
            ray.shutdown()
            _opened_here = False
            _drop_private_token()


def _user_token() -> bool:
    """Whether the user chose Ray's authentication: a mode, a token or a token file."""
    env = os.environ
    if env.get("RAY_AUTH_MODE") or env.get("RAY_AUTH_TOKEN") or env.get("RAY_AUTH_TOKEN_PATH"):
        return True
    return (Path.home() / ".ray" / "auth_token").exists()


def _reset_token_cache() -> None:
    """Ray's cached configuration and token read again from the environment."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except Exception:  # noqa: BLE001 - an older Ray without token authentication
        pass


def _private_token() -> None:
    """A token of its own for the cluster about to start here, in this process's environment
    (inherited by the cluster's processes; ``ray.init`` then turns token authentication on
    and finds the token, so it writes none), unless the user chose otherwise."""
    if _user_token():
        return
    _set_here.update(RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_AUTH_MODE="token")
    os.environ["RAY_AUTH_TOKEN"] = _set_here["RAY_AUTH_TOKEN"]
    _reset_token_cache()


def _drop_private_token() -> None:
    for key, value in list(_set_here.items()):
        if os.environ.get(key) == value:
            del os.environ[key]
    if _set_here:
        _set_here.clear()
        _reset_token_cache()


def alive_nodes(ray: Any) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def node_alive(ray: Any, node_id: str) -> bool:
    return any(n.get("NodeID") == node_id and n.get("Alive") for n in ray.nodes())


def node_slots(node: dict, backend: str, resource: str) -> int:
    """How many slots ``node`` offers: its GPUs (``cuda``; at most its units of ``resource``
    when that is a custom resource), or its units of ``resource`` (``cpu``)."""
    res = node.get("Resources") or {}
    if backend == "cuda":
        n = int(res.get("GPU", 0))
        if resource != "GPU":
            n = min(n, int(res.get(resource, 0)))
        return n
    return int(res.get(resource, 0))


def slot_name(node_id: str, index: int) -> str:
    return f"cuda-agent-slot-{node_id}-{index}"


def store_actor(ray: Any, namespace: str, directory: str = "") -> Any:
    """The cluster's baseline store (named, detached, on the head node), started if missing."""
    cls = ray.remote(BaselineStore)
    return cls.options(name=STORE_NAME, namespace=namespace, get_if_exists=True, lifetime="detached",
                       num_cpus=0, max_concurrency=32, resources={HEAD_RESOURCE: 0.001}).remote(directory)


def pool_actors(ray: Any, namespace: str, backend: str, resource: str) -> list[tuple[str, Any]]:
    """``[(name, handle)]`` of the slot actors of the live nodes and the store of ``namespace``."""
    out = []
    names = [slot_name(n["NodeID"], i) for n in alive_nodes(ray) for i in range(node_slots(n, backend, resource))]
    for name in [*names, STORE_NAME]:
        try:
            out.append((name, ray.get_actor(name, namespace=namespace)))
        except ValueError:  # no such actor (never started, or ended)
            continue
    return out


def shutdown_pool(ray: Any, namespace: str, backend: str, resource: str) -> int:
    """End the slot actors (their workers first) and the baseline store of ``namespace``; how many."""
    n = 0
    for name, handle in pool_actors(ray, namespace, backend, resource):
        if name != STORE_NAME:
            try:
                ray.get(handle.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - killed below all the same
                pass
        try:
            ray.kill(handle, no_restart=True)
            n += 1
        except Exception:  # noqa: BLE001
            pass
    return n
