"""Bad executor options and unreachable clusters end with one line that names the problem,
before any Ray process starts."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("ray")

from cuda_agent.core.errors import ConfigError  # noqa: E402
from cuda_agent.core.plugins import PluginManager  # noqa: E402
from cuda_agent_ray.executor import RayExecutor, RayExecutorOptions  # noqa: E402


@pytest.mark.parametrize("options, message", [
    ({"backend": "gpu"}, "backend must be cuda or cpu, got 'gpu'"),
    ({"node_loss": "maybe"}, "node_loss must be one of retry, fail, got 'maybe'"),
    ({"builds": "remote"}, "builds must be one of local, ray, got 'remote'"),
    ({"backend": "cpu", "slot_resource": "GPU"}, "the cpu backend counts slots in a custom resource"),
    ({"pool": {"devices": "0,1"}}, "pool.devices is set by the cluster"),
    ({"pool": {"sparez": 1}}, "pool: unknown LocalExecutorOptions option 'sparez'"),
])
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(ConfigError) as info:
        RayExecutor(RayExecutorOptions(**options))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unknown_option_names_the_closest():
    import cuda_agent_ray

    pm = PluginManager(load_entry_points=False)
    pm.register(cuda_agent_ray, "ray")
    with pytest.raises(ConfigError, match="nodeloss.*node_loss"):
        pm.create("executor", {"name": "ray", "options": {"nodeloss": "fail"}})


def test_no_cluster_at_the_address_is_said_at_once():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ex = RayExecutor(RayExecutorOptions(address=f"127.0.0.1:{port}", backend="cpu"))
    with pytest.raises(ConfigError, match=f"no Ray cluster answers at 127.0.0.1:{port}.*ray start --head"):
        ex.start()
    with pytest.raises(ConfigError, match="is not auto, host:port or ray://host:port"):
        RayExecutor(RayExecutorOptions(address="nonsense", backend="cpu")).start()
