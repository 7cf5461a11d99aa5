"""The agent's tool scripts (tools/compile.py, verify.py, profile.py, _client.py):
standard library only, old-Python syntax, clear when the service is absent, and working
inside the minimal Debian sandbox image against a service on the host."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
TOOLS = REPO / "tools"
SCRIPTS = ["_client.py", "compile.py", "verify.py", "profile.py"]
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.mark.parametrize("name", SCRIPTS)
def test_standard_library_only_and_python38_syntax(name):
    src = (TOOLS / name).read_text()
    tree = ast.parse(src, feature_version=(3, 8))
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module.split(".")[0])
    allowed = set(sys.stdlib_module_names) | {"_client", "__future__"}
    assert mods <= allowed, f"{name} imports {sorted(mods - allowed)}"


def test_help_and_unreachable_service(tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(TOOLS, ws / "tools", ignore=shutil.ignore_patterns("template", "__pycache__"))
    r = subprocess.run([sys.executable, "-S", "-I", str(ws / "tools" / "verify.py"), "--help"],
                       capture_output=True, text=True, cwd=ws)
    assert r.returncode == 0 and r.stdout.startswith("usage: python tools/verify.py")
    for name in ("compile", "verify", "profile"):
        r = subprocess.run([sys.executable, "-S", "-I", str(ws / "tools" / f"{name}.py")],
                           capture_output=True, text=True, cwd=ws)
        assert r.returncode == 2
        assert r.stdout.startswith("ERROR: cannot reach the workspace service")
        assert r.stderr == ""  # no traceback for the agent to puzzle over
        if name != "compile":  # after a run: the command that works without a service
            assert f"re-check this folder with `cuda-agent {name} {ws}`" in r.stdout, r.stdout
    assert not (ws / "tools" / "__pycache__").exists()  # nothing written into the workspace


def _sandbox_image() -> str | None:
    if shutil.which("docker") is None:
        return None
    try:
        out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "cuda-agent-sandbox"],
                             capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_scripts_inside_the_minimal_debian_sandbox(tmp_path):
    image = _sandbox_image()
    if image is None:
        pytest.skip("no local cuda-agent-sandbox image (cuda-agent sandbox build-image)")
    from test_service import GOOD, WRONG, make_ws, service
    from test_service_kit import TinyGxx  # noqa: F401  (importable by the workers)

    from cuda_agent.sandbox.executors.local import CpuExecutor, CpuExecutorOptions

    ws = make_ws(tmp_path / "ws")
    ex = CpuExecutor(CpuExecutorOptions(workers=1, preload=[], warm_plugins=False, timeout=30, prestart=False))
    try:
        with service(ws, ex):
            def run(script):
                return subprocess.run(
                    ["docker", "run", "--rm", "--network", "none", "-v", f"{ws}:/workspace", "-w", "/workspace",
                     image, "python3", f"tools/{script}.py"],
                    capture_output=True, text=True, timeout=120)

            r = run("verify")
            assert r.returncode == 0, r.stdout + r.stderr
            assert r.stdout.startswith("VERIFY PASSED")
            (ws / "kernels" / "axpb.cpp").write_text(WRONG)
            r = run("verify")
            assert r.returncode == 1 and r.stdout.startswith("VERIFY FAILED (wrong result)")
            (ws / "kernels" / "axpb.cpp").write_text(GOOD)
            r = run("profile")
            assert r.returncode == 0 and r.stdout.startswith("PROFILE: eager"), r.stdout + r.stderr
    finally:
        ex.close()
