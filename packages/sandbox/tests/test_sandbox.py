"""Escape attempts against both sandboxes, each refused with a clear message while the
host stays healthy: writing protected files, reading another workspace, opening a
network connection, a fork bomb, filling the disk, exhausting memory, outliving a timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

from cuda_agent.core.plugins import get_plugin_manager
from cuda_agent.core.types import Task
from cuda_agent.sandbox.isolation.sandboxes import DockerSandbox, LocalSandbox
from cuda_agent.sandbox.isolation.sandboxes.common import is_root
from cuda_agent.sandbox.isolation.sandboxes.local import _namespaces_work
from cuda_agent.sandbox.workspace.workspace import create_workspace

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(8)]

def get_init_inputs():
    return []
"""

LIMITS = dict(file_size_mb=16, tmp_mb=16, disk_mb=48, max_output_kb=64)


def docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def docker_image():
    """The sandbox image, built once if missing (CI builds it before the tests)."""
    if not docker_available():
        pytest.skip("no Docker engine reachable")
    from cuda_agent.sandbox.isolation.sandboxes.image import DEFAULT_IMAGE, build_image

    try:
        build_image(DEFAULT_IMAGE, log=lambda *_: None)
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"cannot build the sandbox image: {exc}")
    return DEFAULT_IMAGE


@pytest.fixture(params=["local", "docker"])
def kind(request):
    if request.param == "docker":
        request.getfixturevalue("docker_image")
    return request.param


def isolated(session) -> bool:
    """Whether a local session got its own user and namespaces (root with working unshare)."""
    return getattr(session, "mode", "docker") in ("user", "docker")


def make_sandbox(kind: str, **extra):
    if kind == "local":
        return LocalSandbox(LocalSandbox.Options(**{"nproc": 64, "memory_mb": 1024, **LIMITS, **extra}))
    return DockerSandbox(DockerSandbox.Options(**{"pids": 64, "memory_mb": 512, **LIMITS, **extra}))


def workspace(tmp_path, name="ws"):
    return create_workspace(Task(id="t", source="test", code=TASK), tmp_path / name, backend="cpu")


@pytest.fixture
def ws(tmp_path):
    return workspace(tmp_path)


def test_plugins_registered():
    comps = get_plugin_manager().components("sandbox")
    assert {"local", "docker"} <= set(comps)


def test_commands_and_persistent_shell(kind, ws):
    with make_sandbox(kind).open(ws.root, ws.protected) as s:
        r = s.run("echo hello > kernels/a.cpp && cat kernels/a.cpp && pwd && python3 -c 'print(6*7)'")
        assert r.exit_code == 0, r.output
        assert "hello" in r.output and "42" in r.output
        assert (ws.root / "kernels" / "a.cpp").read_text() == "hello\n"
        assert s.run("exit 3").exit_code == 3
        p = s.spawn(["bash", "--noprofile", "--norc"])
        p.stdin.write(b"cd kernels; echo in-$(basename $PWD)\n")
        p.stdin.flush()
        line = p.stdout.readline()
        assert line.strip() == b"in-kernels"
        assert p.poll() is None
        p.kill()
        assert p.poll() is not None


def test_host_environment_does_not_leak(kind, ws, monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_TEST_SECRET", "s3cret")
    with make_sandbox(kind).open(ws.root, ws.protected) as s:
        r = s.run("env", env={"MINE": "1"})
        assert "s3cret" not in r.output and "MINE=1" in r.output
        assert "CUDA_AGENT_SERVICE=" in r.output


def test_protected_files_cannot_be_changed(kind, ws):
    before = {p: (ws.root / p).read_bytes() for p in ("model.py", "SKILL.md", "tools/verify.py", "cuda_agent_runtime.py")}
    attempts = [
        "echo hacked > model.py",
        "echo hacked >> SKILL.md",
        "rm -f model.py",
        "mv model.py m.py",
        "chmod u+w model.py && echo hacked > model.py",
        "rm -rf tools",
        "echo x > tools/verify.py",
        "touch tools/new.py",
        "ln -sf /etc/passwd cuda_agent_runtime.py",
        "echo x > .cuda_agent/build/manifest.json",
    ]
    with make_sandbox(kind).open(ws.root, ws.protected) as s:
        if not isolated(s):
            pytest.skip("no separate user here (not root, or no namespaces)")
        for cmd in attempts:
            r = s.run(cmd)
            assert r.exit_code != 0, (cmd, r.output)
            assert any(m in r.output for m in ("Permission denied", "Read-only file system",
                                               "Operation not permitted")), (cmd, r.output)
        assert s.run("echo ok > model_new.py && echo ok > kernels/k.cpp").exit_code == 0
    for p, data in before.items():
        assert (ws.root / p).read_bytes() == data, p
    assert not (ws.root / "tools" / "new.py").exists()


def test_other_workspace_cannot_be_read(kind, tmp_path):
    mine = workspace(tmp_path, "mine")
    other = workspace(tmp_path, "other")
    (other.root / "kernels" / "secret.cpp").write_text("TOP-SECRET")
    sb = make_sandbox(kind)
    with sb.open(other.root, other.protected), sb.open(mine.root, mine.protected) as s:
        if not isolated(s):
            pytest.skip("no separate user here (not root, or no namespaces)")
        for cmd in (f"cat {other.root}/kernels/secret.cpp", f"ls {other.root}", f"cat {other.root}/model.py",
                    "cat ../other/kernels/secret.cpp"):
            r = s.run(cmd)
            assert r.exit_code != 0 and "TOP-SECRET" not in r.output, (cmd, r.output)
            assert "No such file" in r.output or "Permission denied" in r.output, r.output


@pytest.mark.skipif(not (is_root() and _namespaces_work()), reason="separate user ids need root and namespaces")
def test_other_workspace_refused_by_permissions_even_when_visible(tmp_path):
    """Local sandbox: with the other workspace's path mounted in view, its own user id and
    mode 1770 still refuse access."""
    mine = workspace(tmp_path, "mine")
    other = workspace(tmp_path, "other")
    (other.root / "kernels" / "secret.cpp").write_text("TOP-SECRET")
    sb = make_sandbox("local", expose=[str(other.root)])
    with sb.open(other.root, other.protected), sb.open(mine.root, mine.protected) as s:
        r = s.run(f"ls -ld {other.root}; cat {other.root}/kernels/secret.cpp")
        assert "TOP-SECRET" not in r.output and "Permission denied" in r.output, r.output


@pytest.fixture
def tcp_server():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 0))
    srv.listen(5)
    srv.settimeout(0.2)
    hits = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, addr = srv.accept()
                hits.append(addr)
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1], hits
    stop.set()
    t.join(1)
    srv.close()


def host_ip() -> str:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("10.255.255.255", 1))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()


def test_no_network(kind, ws, tcp_server):
    port, hits = tcp_server
    # the server is reachable from the host itself
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    deadline = time.time() + 2
    while not hits and time.time() < deadline:
        time.sleep(0.05)
    assert hits
    hits.clear()
    code = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3); print('CONNECTED')"
    with make_sandbox(kind).open(ws.root, ws.protected) as s:
        if not isolated(s):
            pytest.skip("no network namespace here")
        for host in ("127.0.0.1", host_ip(), "1.1.1.1"):
            r = s.run(f'python3 -c "{code}" {host} {port}', timeout=20)
            assert r.exit_code != 0 and "CONNECTED" not in r.output, (host, r.output)
            assert any(m in r.output for m in ("unreachable", "refused", "timed out")), r.output
    assert hits == []


def test_fork_bomb_is_contained(kind, ws):
    with make_sandbox(kind).open(ws.root, ws.protected) as s:
        if not isolated(s):
            pytest.skip("a fork bomb is only contained with a separate user (RLIMIT_NPROC) or a container")
        t0 = time.monotonic()
        r = s.run("bomb() { bomb | bomb & }; bomb; sleep 30", timeout=8)
        assert time.monotonic() - t0 < 30
        assert r.timed_out or r.exit_code != 0
        assert "Resource temporarily unavailable" in r.output or "timed out" in r.output, r.output[-500:]
        # the host still starts processes, and so does the sandbox
        assert subprocess.run(["true"]).returncode == 0
        r2 = s.run("echo alive", timeout=30)
        assert r2.exit_code == 0 and "alive" in r2.output, r2.output
        if kind == "local" and s.lease is not None:
            uid = s.lease.uid
            deadline = time.time() + 5
            while True:  # SIGKILLed processes vanish asynchronously
                left = [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) == uid]
                if not left or time.time() > deadline:
                    break
                time.sleep(0.1)
            assert left == [], [_cmdline(p) for p in left]


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode() + " " + open(f"/proc/{pid}/stat").read().split()[2]
    except OSError:
        return "?"


def _uid_of(pid: str):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def test_timeout_kills_the_command_and_its_children(kind, ws):
    with make_sandbox(kind).open(ws.root, ws.protected) as s:
        r = s.run("(sleep 60; echo late > kernels/late.txt) & sleep 60", timeout=1.5)
        assert r.timed_out and r.exit_code is None and "timed out" in r.output
        time.sleep(0.5)
        r2 = s.run("ps -eo args | grep -c '^sleep 60' || true")
        assert r2.output.strip().splitlines()[0] == "0", r2.output


def test_filling_the_disk_is_refused(kind, ws):
    with make_sandbox(kind).open(ws.root, ws.protected) as s:
        # one big file: the file-size limit
        r = s.run("head -c 40M /dev/zero > kernels/big.bin; echo rc=$?")
        assert "rc=0" not in r.output
        assert "File size limit exceeded" in r.output or "file size limit" in r.output, r.output
        assert (ws.root / "kernels" / "big.bin").stat().st_size <= 16 * 1024 * 1024
        s.run("rm -f kernels/big.bin")
        # scratch space is a small private tmpfs
        if not isolated(s):
            return
        r = s.run("head -c 12M /dev/zero > /tmp/a && head -c 12M /dev/zero > /tmp/b; echo rc=$?")
        assert "No space left on device" in r.output and "rc=0" not in r.output, r.output
        # many files under the size limit: the workspace's file system is full (or, without
        # one, the disk watchdog stops the session)
        r = s.run("for i in $(seq 1 20); do head -c 8M /dev/zero > kernels/f$i.bin || break; sleep 0.2; done; "
                  "echo finished", timeout=60)
        if s.disk_fs != "none":
            assert "No space left on device" in r.output and "the workspace is full" in r.output, r.output
        else:
            assert "finished" not in r.output and "disk limit" in r.output, r.output
        s.run("rm -f kernels/*.bin")
        assert s.run("echo fine").exit_code == 0
    total = sum(p.stat().st_size for p in ws.root.rglob("*") if p.is_file())
    assert total < 64 * 1024 * 1024


def test_memory_is_limited(kind, ws):
    with make_sandbox(kind).open(ws.root, ws.protected) as s:
        r = s.run("python3 -c \"b = bytearray(3 * 1024**3); b[::4096] = b'x' * len(b[::4096]); print('ALLOCATED')\"",
                  timeout=60)
        assert "ALLOCATED" not in r.output and r.exit_code != 0
        assert "MemoryError" in r.output or "killed" in r.output, r.output


def test_docker_engine_from_docker_host(docker_image, ws, monkeypatch):
    """The engine is found through DOCKER_HOST (here the local engine named explicitly)."""
    import docker

    url = docker.from_env().api.base_url
    sock = "/var/run/docker.sock"
    if not os.path.exists(sock):
        pytest.skip("the engine is not on the default local socket")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    with make_sandbox("docker").open(ws.root, ws.protected) as s:
        assert s.run("echo via-docker-host").output.strip() == "via-docker-host"
    assert url


def test_docker_unreachable_engine_is_one_clear_error(ws, monkeypatch):
    from cuda_agent.sandbox.isolation.sandboxes import SandboxError

    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    with pytest.raises(SandboxError, match="cannot reach a Docker engine at tcp://127.0.0.1:1"):
        make_sandbox("docker").open(ws.root, ws.protected)


def test_build_image_from_local_rootfs_is_checked(tmp_path):
    from cuda_agent.sandbox.isolation.sandboxes import SandboxError
    from cuda_agent.sandbox.isolation.sandboxes.image import import_rootfs

    (tmp_path / "bin").mkdir()
    with pytest.raises(SandboxError, match="lacks bin/bash"):
        import_rootfs(None, tmp_path, "cuda-agent-sandbox:test-never-built")


def test_agent_shell_runs_in_the_sandbox(kind, ws):
    """The agent's persistent bash tool (core) on top of ``session.spawn``."""
    from cuda_agent.core.tools.base import ToolContext
    from cuda_agent.core.tools.shell import ShellSession

    with make_sandbox(kind).open(ws.root, ws.protected) as s:
        ctx = ToolContext(ws.root, protected=ws.protected, spawn=s.spawn)
        sh = ShellSession(ctx)
        out, status, timed_out = sh.run("cd kernels && X=7 && echo made > k.cpp", 20)
        assert status == 0 and not timed_out, out
        out, status, _ = sh.run("echo $X $(basename $PWD) $(cat k.cpp)", 20)
        assert out.strip() == "7 kernels made" and status == 0
        out, status, _ = sh.run("echo hacked > ../model.py", 20)
        assert status != 0 and ("Permission denied" in out or "Read-only" in out)
        out, status, timed_out = sh.run("sleep 30", 1)
        assert timed_out
        sh.close()


def test_service_socket_is_reachable_from_the_sandbox(kind, ws):
    """The tool scripts talk to the workspace service over .cuda_agent/service.sock: it must
    stay reachable although the folder is read-only (and the network is cut)."""
    path = ws.root / ".cuda_agent" / "service.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    os.chmod(path, 0o666)
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        conn.sendall(b"SERVICE-OK")
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    code = ("import os, socket; s = socket.socket(socket.AF_UNIX); "
            "s.connect(os.environ['CUDA_AGENT_SERVICE']); print(s.recv(100).decode())")
    try:
        with make_sandbox(kind).open(ws.root, ws.protected) as s:
            r = s.run(f'python3 -c "{code}"', timeout=30)
            assert "SERVICE-OK" in r.output, r.output
            r = s.run("rm -f .cuda_agent/service.sock; ls .cuda_agent/service.sock")
            assert r.exit_code == 0 and path.exists(), r.output
    finally:
        srv.close()


def test_local_without_isolation_still_limits_and_kills(ws):
    """isolation: none (what a non-root user gets): limits, clean environment and
    process-group kills still hold."""
    sb = LocalSandbox(LocalSandbox.Options(isolation="none", **LIMITS))
    with sb.open(ws.root, ws.protected) as s:
        assert s.mode == "none"
        r = s.run("echo $HOME; head -c 40M /dev/zero > kernels/big.bin; echo rc=$?")
        assert "rc=0" not in r.output and ".cuda_agent/tmp" in r.output
        r = s.run("(sleep 61.4321; echo late > kernels/late.txt) & sleep 61.4321", timeout=1)
        assert r.timed_out
        time.sleep(1.5)
        assert not (ws.root / "kernels" / "late.txt").exists()
        out = subprocess.run(["pgrep", "-f", "^sleep 61.4321$"], capture_output=True, text=True).stdout
        assert out.strip() == ""


def test_bad_options_are_one_line_errors(ws):
    from cuda_agent.core.errors import ConfigError
    from cuda_agent.sandbox.isolation.sandboxes import SandboxError

    with pytest.raises(SandboxError, match="isolation must be"):
        LocalSandbox(LocalSandbox.Options(isolation="chroot")).open(ws.root, ws.protected)
    with pytest.raises(ConfigError, match="unknown option"):
        get_plugin_manager().create("sandbox", {"name": "local", "options": {"netwrok": True}})


@pytest.mark.skipif(not (is_root() and _namespaces_work()), reason="separate user ids need root and namespaces")
def test_sessions_on_one_workspace_share_its_user(ws, tmp_path):
    sb = make_sandbox("local")
    a = sb.open(ws.root, ws.protected)
    b = sb.open(ws.root, ws.protected)
    other = workspace(tmp_path, "other")
    c = sb.open(other.root, other.protected)
    try:
        assert a.lease.uid == b.lease.uid != c.lease.uid
        p = b.spawn(["sleep", "30"])
        a.close()
        assert p.poll() is None  # closing one session leaves the other's processes alone
        assert b.run("echo x > kernels/x.cpp && cat kernels/x.cpp").output.strip() == "x"
    finally:
        b.close()
        c.close()
    assert p.poll() is not None


def test_files_written_by_host_tools_become_the_agents(kind, ws):
    """The agent's write/edit tools run host-side; what they create must stay editable
    from the agent's shell."""
    with make_sandbox(kind).open(ws.root, ws.protected) as s:
        if not isolated(s) or s.lease is None:
            pytest.skip("no separate user here")
        (ws.root / "kernels" / "sub").mkdir()
        (ws.root / "kernels" / "sub" / "new.cu").write_text("// from the write tool\n")
        (ws.root / "model_new.py").write_text("# rewritten by the edit tool\n")
        r = s.run("echo '// appended' >> kernels/sub/new.cu && echo '# more' >> model_new.py && "
                  "touch kernels/sub/other.cu && cat kernels/sub/new.cu")
        assert r.exit_code == 0 and "appended" in r.output, r.output
        assert (ws.root / "model.py").stat().st_uid == 0  # protected files are left alone


def agent_shell(s, ws):
    from cuda_agent.core.tools.base import ToolContext
    from cuda_agent.core.tools.shell import ShellSession

    return ShellSession(ToolContext(ws.root, protected=ws.protected, spawn=s.spawn))


def test_a_silent_command_runs_until_its_own_timeout_in_the_agent_shell(kind, ws):
    """A command that prints nothing for longer than the Docker API's socket timeout (here
    lowered to 1.5 s) is still running, not taken for a shell that exited; past its own
    timeout it is killed with everything it started."""
    with make_sandbox(kind, **({"api_timeout_s": 1.5} if kind == "docker" else {})).open(ws.root, ws.protected) as s:
        sh = agent_shell(s, ws)
        t0 = time.monotonic()
        out, status, timed_out = sh.run("sleep 4; echo done", 30)
        assert (out.strip(), status, timed_out) == ("done", 0, False), out
        assert time.monotonic() - t0 >= 4
        t0 = time.monotonic()
        out, status, timed_out = sh.run("sleep 5; echo five; sleep 30; echo late > kernels/late.txt", 8)
        took = time.monotonic() - t0
        assert timed_out and status is None and "five" in out, out
        assert 8 <= took < 20, took
        sh = agent_shell(s, ws)
        out, status, _ = sh.run("ps -eo args | grep -c '^sleep 30' || true", 20)
        assert out.strip() == "0", out
        assert not (ws.root / "kernels" / "late.txt").exists()
        sh.close()


BOUNDED_BOMB = ("bomb() { [ $1 -lt 9 ] && { bomb $(($1 + 1)) | bomb $(($1 + 1)) & }; sleep 20; }; "
                "bomb 0 & sleep 2; echo started")  # 2^10 processes wanted, each gone after 20 s


def test_a_fork_bomb_ends_with_its_command_in_the_agent_shell(kind, ws):
    """What a command leaves running ends with it (a fork bomb included) and the agent is told;
    the next command runs; a background job is kept and is named as holding processes."""
    with make_sandbox(kind).open(ws.root, ws.protected) as s:
        if not isolated(s):
            pytest.skip("a fork bomb is only contained with a separate user (RLIMIT_NPROC) or a container")
        job = s.spawn(["bash", "-c", "sleep 60 & sleep 60 & wait"])
        sh = agent_shell(s, ws)
        out, status, timed_out = sh.run(BOUNDED_BOMB, 30)
        assert not timed_out and "started" in out, out[-800:]
        assert "processes running; they were stopped" in out, out[-800:]
        assert "the process limit was reached: the sandbox runs at most 64 processes" in out, out[-800:]
        assert "background jobs hold" in out, out[-800:]
        t0 = time.monotonic()
        out, status, timed_out = sh.run("echo alive; ps -eo args | grep -c '^sleep 20' || true", 20)
        assert status == 0 and out.strip().splitlines()[-1] == "0" and "alive" in out, out[-800:]
        assert time.monotonic() - t0 < 10
        assert "fork" not in out, out[-800:]
        assert job.poll() is None  # started on purpose as a job of its own: kept
        job.kill()
        sh.close()


def test_a_full_tmp_is_named_not_the_workspace(kind, ws):
    with make_sandbox(kind, file_size_mb=32).open(ws.root, ws.protected) as s:
        if not isolated(s):
            pytest.skip("a private size-limited /tmp needs a separate user and namespaces, or a container")
        sh = agent_shell(s, ws)
        out, status, _ = sh.run("head -c 10M /dev/zero > /tmp/a; head -c 10M /dev/zero > /tmp/b", 20)
        assert "No space left on device" in out, out
        assert "[sandbox] /tmp is full: it holds at most 16 MB" in out, out
        assert "[sandbox] the workspace is full" not in out, out
        out, status, _ = sh.run("rm /tmp/a /tmp/b && echo ok", 20)
        assert out.strip() == "ok" and "is full" not in out, out
        sh.close()
        r = s.run("head -c 20M /dev/zero > /var/tmp/a")
        assert "No space left on device" in r.output and "[sandbox] the workspace is full" not in r.output, r.output
        if kind == "docker":
            assert "[sandbox] /var/tmp is full: it holds at most 16 MB" in r.output, r.output
        else:  # the command's private file systems ended with it: the limits are named
            assert "no space left on device: the workspace holds at most 48 MB" in r.output, r.output
            assert "/tmp, /var/tmp and /dev/shm hold at most 16 MB each" in r.output, r.output
