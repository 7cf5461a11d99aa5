"""What Ray leaves in the user's home: the clusters of this plugin neither read it nor add to it.

* The machine's test cluster (:class:`LocalCluster`) gives its nodes a home of their own and
  its own authentication settings, whatever the user's environment holds.
* A cluster started in-process (``executor.options.address`` empty, as ``cuda-agent executor
  check`` does) authenticates with a token of its own held in the environment while it runs:
  no ``~/.ray/auth_token`` is written (Ray's default), and none of it is left after it ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray")

from cuda_agent_ray.localcluster import LocalCluster  # noqa: E402


def test_the_test_cluster_takes_nothing_from_the_users_environment(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "the-users-token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/nowhere/auth_token")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    c = LocalCluster()
    try:
        assert c.env["HOME"] == str(c.home) and c.home.is_dir() and c.home.parent == c.root
        assert c.env["RAY_AUTH_MODE"] == "disabled" == c.client_env["RAY_AUTH_MODE"]
        assert not {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"} & set(c.env)
    finally:
        c.stop()
    assert not c.root.exists()


PROBE = textwrap.dedent("""
    import json, os
    from cuda_agent_ray import cluster
    ray = cluster.connect("", "state-probe", local_resources={"cuda_agent_slot": 1})
    during = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    value = ray.get(ray.remote(lambda: 6 * 7).remote())
    cluster.release()
    after = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    print(json.dumps({"value": value, "during": during, "after": after}))
""")


def test_an_in_process_cluster_writes_nothing_to_the_users_home(foreign_home, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["value"] == 42
    assert out["during"]["RAY_AUTH_MODE"] == "token" and len(out["during"]["RAY_AUTH_TOKEN"] or "") == 64
    assert out["after"] == {"RAY_AUTH_MODE": None, "RAY_AUTH_TOKEN": None}
    assert list(home.rglob("*")) == [], list(home.rglob("*"))  # no ~/.ray/auth_token, nothing at all


def test_ports_handed_to_a_cluster_are_distinct_and_never_in_its_worker_ranges():
    from cuda_agent_ray.localcluster import LocalCluster, free_ports

    ports = free_ports(20)
    assert len(set(ports)) == 20
    again = free_ports(20, ports)  # ports given back are often handed out again: not these
    assert len(set(again)) == 20 and not set(ports) & set(again)
    c = LocalCluster()
    try:
        workers = set(range(c._worker_base, c._worker_base + 200 * 16))
        assert c.port in c._ports and c.port not in workers
    finally:
        import shutil

        shutil.rmtree(c.root, ignore_errors=True)
