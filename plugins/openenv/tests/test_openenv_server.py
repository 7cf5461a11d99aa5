"""Our environment behind the real openenv-core server on loopback, driven by its WebSocket client:
an episode on a CPU-backend task is scored by the judge, and bad actions get clear errors."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="openenv-core is not installed (pip install -e 'plugins/openenv[openenv]')")
uvicorn = pytest.importorskip("uvicorn")

from cuda_agent.core.types import Task  # noqa: E402
from cuda_agent_openenv import (  # noqa: E402
    CudaAction,
    CudaEnvClient,
    EpisodeFactory,
    EpisodeOptions,
    ToolCallSpec,
    create_app,
)

EXAMPLE = (Path(__file__).resolve().parents[3] / "tools" / "template" / "gxx" / "examples" / "model.py").read_text()
COPY = "cp -r examples/kernels examples/model_new.py ."


@pytest.fixture
def server(tmp_path):
    scored = []
    episodes = EpisodeFactory([Task(id="axpby", source="test", code=EXAMPLE)],
                              options=EpisodeOptions(backend="cpu", max_turns=3, tools=["bash", "read"],
                                                     workdir=str(tmp_path / "ws")),
                              on_end=lambda ep, traj: scored.append(traj.reward.value if traj.reward else None))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(episodes, max_concurrent_envs=2), host="127.0.0.1", port=port,
                                        log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            break
        except OSError:
            time.sleep(0.05)
    yield url, scored
    srv.should_exit = True
    thread.join(10)
    episodes.close()


def test_an_episode_through_the_client_is_scored_by_the_judge(server):
    url, scored = server
    with CudaEnvClient(base_url=url, message_timeout_s=300).sync() as env:
        first = env.reset(task_id="axpby")
        obs = first.observation
        assert not first.done and obs.task_id == "axpby" and obs.turns_left == 3
        assert [t["function"]["name"] for t in obs.tools] == ["bash", "read"]
        assert "Task axpby" in obs.messages[1]["content"] and "SKILL.md" in obs.messages[0]["content"]
        step = env.step(CudaAction(content="Copying the example.", tool_calls=[
            ToolCallSpec(name="bash", arguments={"command": COPY}), ToolCallSpec(name="nvcc_magic")]))
        ok, unknown = step.observation.results
        assert ok.ok and not step.done
        assert not unknown.ok and "unknown tool 'nvcc_magic'" in unknown.content  # an error the model reads
        step = env.step(CudaAction(content='<tool_call>\n{"name": "read", "arguments": {"path": "kernels/axpby.cpp"}}'
                                           '\n</tool_call>'))
        assert "extern \"C\"" in step.observation.results[0].content
        last = env.step(CudaAction(content="The example kernel is in place.\nDONE"))
        assert last.done and last.observation.finish_reason == "done"
        assert scored and last.reward == scored[-1]  # the judge's reward, as the client sees it
        assert last.observation.verdict["reward"] == "milestone"
        assert env.state().finish_reason == "done"
        with pytest.raises(RuntimeError, match="is over \\(done after 3 turns\\).*reset"):
            env.step(CudaAction(tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})]))
        # the session survives a refused step: a new episode starts on reset
        again = env.reset(task_id="axpby")
        assert not again.done and again.observation.turns_left == 3


def test_bad_actions_get_clear_errors(server):
    url, _ = server
    with CudaEnvClient(base_url=url, message_timeout_s=120).sync() as env:
        with pytest.raises(RuntimeError, match="send reset"):
            env.step(CudaAction(content="hello"))
        with pytest.raises(RuntimeError, match="unknown task 'axpbz'.*did you mean 'axpby'"):
            env.reset(task_id="axpbz")
        out = env.reset()  # no task named: the tasks in turn
        assert out.observation.task_id == "axpby"
        limit = None
        for _ in range(3):
            limit = env.step(CudaAction(tool_calls=[ToolCallSpec(name="bash", arguments={"command": "true"})]))
        assert limit.done and limit.observation.finish_reason == "max_turns" and limit.reward == -1.0
    # a malformed action is refused by the server's schema, naming the field
    body = json.dumps({"action": {"tool_calls": [{"name": "bash", "argumnts": {}}]}}).encode()
    req = urllib.request.Request(url + "/step", data=body, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 422 and "argumnts" in err.value.read().decode()
    schema = json.loads(urllib.request.urlopen(url + "/schema", timeout=30).read())
    assert "tool_calls" in json.dumps(schema["action"])


def test_the_entry_point_loads_without_openenv_core():
    # the plugin manager imports every plugin's entry point: one whose framework is not
    # installed must not stop the other commands
    import subprocess
    import sys

    code = ("import sys; sys.modules['openenv'] = None\n"
            "import cuda_agent_openenv.plugin\n"
            "from cuda_agent.core.plugins import PluginManager\n"
            "PluginManager()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
