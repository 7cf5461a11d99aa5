"""The workspace service over a real Unix socket, driven by the real tool scripts.

The workspace here is a small CPU task: ``model.py`` computes y = 2x + 1 in Python,
the candidate is a C++ function built by g++ into a shared library (a real compile),
and the verify/profile jobs below load both in a CPU executor worker and compare or
time them. The jobs stand in for the torch-based ones so the test stays fast; the
service, socket, compile worker, executor and scripts are the real ones.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cuda_agent.core.types import FailureCategory
from cuda_agent.sandbox.executors.local import CpuExecutor, CpuExecutorOptions
from cuda_agent.sandbox.workspace.service import ServiceOptions, WorkspaceService

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / "tools"
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # executor workers import the helpers by module name
    sys.path.insert(0, str(HERE))

from test_service_kit import TinyGxx  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


MODEL = "class Model:\n    def forward(self, x):\n        return 2.0 * x + 1.0\n"
GOOD = 'extern "C" double axpb(double x) { return 2.0 * x + 1.0; }\n'
WRONG = 'extern "C" double axpb(double x) { return 2.0 * x + 1.5; }\n'
BROKEN = 'extern "C" double axpb(double x) { return 2.0 * x + ; }\n'
SEGV = 'extern "C" double axpb(double x) { volatile int *p = 0; *p = 1; return x; }\n'
HANG = 'extern "C" double axpb(double x) { volatile int i = 0; while (1) { i++; } return x; }\n'


def make_ws(root: Path, kernel: str = GOOD) -> Path:
    (root / "kernels").mkdir(parents=True)
    (root / "tools").mkdir()
    for name in ("_client.py", "compile.py", "verify.py", "profile.py"):
        shutil.copy(TOOLS / name, root / "tools" / name)
    (root / "model.py").write_text(MODEL)
    (root / "model_new.py").write_text("# uses kernels/axpb.cpp\n")
    (root / "kernels" / "axpb.cpp").write_text(kernel)
    return root


@pytest.fixture(scope="module")
def executor():
    ex = CpuExecutor(CpuExecutorOptions(workers=1, preload=[], warm_plugins=False, timeout=30, prestart=False))
    ex.start()
    yield ex
    ex.close()


def service(ws: Path, executor, **opts) -> WorkspaceService:
    options = dict(verify_job="test_service_kit:verify_job", profile_job="test_service_kit:profile_job",
                   verify_timeout=3.0, profile_timeout=20.0, compile_timeout=20.0)
    options.update(opts)
    return WorkspaceService(ws, TinyGxx(), executor, options).start()


def tool(ws: Path, name: str, *args: str, env: dict | None = None, cwd: Path | None = None):
    e = {k: v for k, v in os.environ.items() if k != "CUDA_AGENT_SERVICE"}
    e.update(env or {})
    # a bare interpreter: no site-packages, so the scripts prove they need the standard library only
    return subprocess.run([sys.executable, "-S", "-I", str(ws / "tools" / f"{name}.py"), *args],
                          capture_output=True, text=True, env=e, cwd=cwd or ws, timeout=120)


# --- tests -------------------------------------------------------------------------------------


def test_tool_scripts_end_to_end(tmp_path, executor):
    ws = make_ws(tmp_path / "ws")
    seen = []
    svc = service(ws, executor)
    svc.on_result = seen.append
    svc.context["turn"] = 3
    try:
        assert (ws / ".cuda_agent" / "service.sock").exists()
        r = tool(ws, "compile")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.startswith("COMPILE OK in ") and "kernels/axpb.cpp" in r.stdout

        r = tool(ws, "verify")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.startswith("VERIFY PASSED: 5/5 random inputs match")

        r = tool(ws, "profile")
        assert r.returncode == 0, r.stdout + r.stderr
        line = r.stdout.splitlines()[0]
        assert line.startswith("PROFILE: eager ") and "torch.compile" in line and "yours" in line
        assert "x vs eager" in line and "x vs compile" in line and "(reward " in line
        assert "that verdict reused, the timing ran now" in r.stdout  # verification of unchanged files reused

        r = tool(ws, "profile", "--json")
        answer = json.loads(r.stdout)
        assert answer["ok"] and answer["result"]["profile"]["candidate"]["median_ms"] > 0
        assert answer["reward"]["reward"] == "milestone"
    finally:
        svc.close()
    assert not (ws / ".cuda_agent" / "service.sock").exists()
    kinds = [e["kind"] for e in svc.history]
    assert kinds == ["verify", "profile", "profile"]
    lines = (ws / ".cuda_agent" / "history.jsonl").read_text().splitlines()
    assert [json.loads(x)["kind"] for x in lines] == kinds
    assert json.loads(lines[1])["outcome"]["profile"]["candidate"]["median_ms"] > 0
    assert seen == svc.history
    first = svc.history[0]
    assert first["files"]["kernels/axpb.cpp"] == GOOD and first["turn"] == 3
    assert first["outcome"].verify.ok and first["reward"].value == 1.0


def test_wrong_result_and_compile_error_are_actionable(tmp_path, executor):
    ws = make_ws(tmp_path / "ws", WRONG)
    with service(ws, executor) as svc:
        r = tool(ws, "verify")
        assert r.returncode == 1
        assert r.stdout.startswith("VERIFY FAILED (wrong result): input 1 of 5, output[0] max abs err 5.0e-01")
        r = tool(ws, "profile")
        assert r.returncode == 1 and r.stdout.startswith("VERIFY FAILED (wrong result)")
        assert "PROFILE SKIPPED" in r.stdout
        assert svc.history[-1]["reward"].value == -1.0

        (ws / "kernels" / "axpb.cpp").write_text(BROKEN)
        r = tool(ws, "compile")
        assert r.returncode == 1
        assert r.stdout.startswith("COMPILE FAILED (1 error):")
        assert "kernels/axpb.cpp:1:" in r.stdout and "error:" in r.stdout
        r = tool(ws, "verify")
        assert r.returncode == 1 and r.stdout.startswith("VERIFY FAILED (compile error):")
        out = svc.history[-1]["outcome"]
        assert out.failure is FailureCategory.COMPILE_ERROR

        (ws / "kernels" / "axpb.cpp").write_text(GOOD)  # fixed: the service sees the new files
        assert tool(ws, "verify").returncode == 0


def test_crashing_and_hanging_kernels_do_not_take_the_service_down(tmp_path, executor):
    ws = make_ws(tmp_path / "ws", SEGV)
    with service(ws, executor) as svc:
        r = tool(ws, "verify")
        assert r.returncode == 1
        assert r.stdout.startswith("VERIFY FAILED (crash): crashed: segmentation fault (signal 11)")
        (ws / "kernels" / "axpb.cpp").write_text(HANG)
        t0 = time.monotonic()
        r = tool(ws, "verify")
        assert r.returncode == 1
        assert r.stdout.startswith("VERIFY FAILED (timeout): timed out after 3 s")
        assert time.monotonic() - t0 < 30
        assert svc.history[-1]["reward"].failure is FailureCategory.TIMEOUT
        (ws / "kernels" / "axpb.cpp").write_text(GOOD)
        assert tool(ws, "verify").returncode == 0


def test_hanging_compile_is_killed(tmp_path, executor):
    ws = make_ws(tmp_path / "ws", GOOD + "// SLEEP_FOREVER_IN_COMPILER\n")
    with service(ws, executor, compile_timeout=2.0) as svc:
        c = svc.compile()
        assert not c.ok and c.errors[0].startswith("compile timed out after 2 s")
        (ws / "kernels" / "axpb.cpp").write_text(GOOD)
        assert svc.compile().ok  # the compile worker was replaced


def test_python_api_evaluate_score_and_inline_compile(tmp_path, executor):
    ws = make_ws(tmp_path / "ws")
    svc = WorkspaceService(ws, TinyGxx(), executor,
                           dict(verify_job="test_service_kit:verify_job", profile_job="test_service_kit:profile_job",
                                compile_in="inline"),
                           reward={"name": "speedup"})
    try:
        out = svc.evaluate()
        assert out.correct and out.compile.ok and out.profile.ok
        r = svc.score(out)
        assert r.reward == "speedup" and r.correct and r.value == pytest.approx(out.profile.speedup_vs_compile())
        assert "t_candidate_ms" in r.raw and "t_compile_ms" in r.raw
        assert svc.verify().ok  # reused: no new job
        assert "verify" in svc.history[-1]["reused"]
        jobs_before = len(svc.history)
        assert svc.verify(fresh=True).ok
        assert len(svc.history) == jobs_before + 1 and svc.history[-1]["reused"] == []  # fresh: a new job
    finally:
        svc.close()


def test_verify_and_profile_as_one_job(tmp_path, executor):
    ws = make_ws(tmp_path / "ws")
    with service(ws, executor, evaluate_job="test_service_kit:evaluate_job") as svc:
        n0 = len(executor.pool.records)
        out = svc.evaluate()
        assert out.correct and out.profile.ok
        kinds = [r.kind for r in executor.pool.records[n0:]]
        assert kinds == ["evaluate"]
        (ws / "kernels" / "axpb.cpp").write_text(WRONG)
        out = svc.evaluate()
        assert out.failure is FailureCategory.WRONG_RESULT and out.profile is None


def test_score_workspace_without_a_socket(tmp_path, executor):
    from cuda_agent.sandbox.workspace.service import score_workspace

    ws = make_ws(tmp_path / "ws")
    opts = {"verify_job": "test_service_kit:verify_job", "profile_job": "test_service_kit:profile_job",
            "compile_in": "inline"}
    r = score_workspace(ws, TinyGxx(), executor, {"name": "milestone"}, opts)
    assert r.correct and r.value in (1.0, 2.0, 3.0) and r.raw["t_candidate_ms"] > 0
    (ws / "kernels" / "axpb.cpp").write_text(BROKEN)
    r = score_workspace(ws, TinyGxx(), executor, "speedup", opts)
    assert r.value == -1.0 and r.failure is FailureCategory.COMPILE_ERROR
    assert r.raw["compile_errors"] and not (ws / ".cuda_agent" / "service.sock").exists()


def test_env_variable_and_cwd_discovery(tmp_path, executor):
    ws = make_ws(tmp_path / "ws")
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copytree(ws / "tools", other / "tools")
    with service(ws, executor):
        # scripts outside the workspace find the socket through the environment variable
        r = tool(other, "compile", env={"CUDA_AGENT_SERVICE": str(ws / ".cuda_agent" / "service.sock")})
        assert r.returncode == 0, r.stdout
        # ... or through the current directory
        r = tool(other, "compile", cwd=ws)
        assert r.returncode == 0, r.stdout
    r = tool(ws, "compile")
    assert r.returncode == 2 and r.stdout.startswith("ERROR: cannot reach the workspace service")


def test_long_workspace_path(tmp_path, executor):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    ws = make_ws(deep / "ws")
    with service(ws, executor):
        sock = ws / ".cuda_agent" / "service.sock"
        assert len(str(sock)) > 108
        assert sock.is_socket() and not sock.is_symlink()  # the real socket, visible through any mount
        r = tool(ws, "compile")
        assert r.returncode == 0, r.stdout
        from cuda_agent.sandbox.workspace.unix_server import connect

        connect(sock).close()


def test_service_options_are_checked(tmp_path):
    from cuda_agent.core.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown service option 'verify_timout'"):
        ServiceOptions.from_any({"verify_timout": 3})
    with pytest.raises(ConfigError, match="compile_in"):
        ServiceOptions.from_any({"compile_in": "docker"})


def test_unknown_job_options_are_config_errors(tmp_path, executor):
    from cuda_agent.core.errors import ConfigError

    ws = make_ws(tmp_path / "ws")
    with pytest.raises(ConfigError, match="service.verify_options: unknown VerifyOptions option 'num_input'"):
        WorkspaceService(ws, TinyGxx(), executor, {"verify_options": {"num_input": 3}})
    with pytest.raises(ConfigError, match="service.profile_options"):
        WorkspaceService(ws, TinyGxx(), executor, {"profile_options": {"profiler_typo": "x"}})
    svc = WorkspaceService(ws, TinyGxx(), executor, {"verify_options": {"num_inputs": 3, "guard": {}}})
    svc.close()


def test_config_fragment_composes():
    from cuda_agent.core.config import compose

    cfg = compose([], ["executor.name=cpu", "executor.options.workers=2", "service.verify_timeout=30",
                       "service.verify_options.num_inputs=3"])
    assert cfg.service.verify_options.num_inputs == 3
    assert cfg.executor.name == "cpu" and cfg.executor.options.workers == 2
    assert ServiceOptions.from_any(cfg.service).verify_timeout == 30
