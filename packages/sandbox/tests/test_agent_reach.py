"""What an adversarial agent can reach through the parts that run with more rights than it
(the host-side file tools, the workspace service, snapshot and restore, the records) and
through its own shell, in both sandboxes: links planted in its files, leaks of files it
cannot read, the disk, and processes that try to outlive their session or touch others."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cuda_agent.core.agent.testing import ScriptedChatServer, reply, tool_call
from cuda_agent.core.cli import main
from cuda_agent.core.interfaces import Compiler
from cuda_agent.core.tools.base import ToolContext
from cuda_agent.core.tools.shell import ShellSession
from cuda_agent.core.types import CompileResult
from cuda_agent.sandbox.isolation.sandboxes import LocalSandbox, SandboxError
from cuda_agent.sandbox.isolation.sandboxes import diskfs
from cuda_agent.sandbox.isolation.sandboxes.common import is_root, processes_of_uid, sweep_uid
from cuda_agent.sandbox.isolation.sandboxes.local import _namespaces_work
from cuda_agent.sandbox.workspace.service import CHANGED, WorkspaceService
from cuda_agent.sandbox.workspace.workspace import RECORD_MODE

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # executor workers import the helpers by module name
    sys.path.insert(0, str(HERE))

from test_sandbox import docker_image, kind, make_sandbox, workspace  # noqa: E402,F401  (fixtures)
from test_service import GOOD, executor, make_ws  # noqa: E402,F401  (executor: a fixture)
from test_service_kit import TinyGxx  # noqa: E402

CANARY = "TOP-SECRET-CANARY-1234"
needs_isolation = pytest.mark.skipif(not (is_root() and _namespaces_work()),
                                     reason="separate user ids and namespaces need root and unshare")


@pytest.fixture
def secret(tmp_path):
    """A file only root may read, in a folder only root may enter."""
    d = tmp_path / "rootonly"
    d.mkdir(mode=0o700)
    f = d / "secret.txt"
    f.write_text(CANARY + "\n")
    f.chmod(0o600)
    return f


def _service(ws: Path, executor, compiler=None, **opts) -> WorkspaceService:
    options = dict(verify_job="test_service_kit:verify_job", profile_job="test_service_kit:profile_job",
                   verify_timeout=5.0, profile_timeout=20.0, compile_timeout=20.0)
    options.update(opts)
    return WorkspaceService(ws, compiler or TinyGxx(), executor, options)


def _everything_under(path: Path) -> str:
    out = []
    for p in path.rglob("*"):
        if p.is_file() and not p.is_symlink():
            out.append(p.read_text(errors="replace"))
    return "\n".join(out)


# --- the service: links are refused, records hold nothing the agent could not read -----------------


def test_service_refuses_a_linked_candidate_and_records_nothing_of_its_target(tmp_path, executor, secret):
    ws = make_ws(tmp_path / "ws")
    (ws / "model_new.py").unlink()
    os.symlink(secret, ws / "model_new.py")
    os.symlink(secret.parent, ws / "kernels" / "sub")
    svc = _service(ws, executor)
    try:
        out = svc.evaluate()
        assert not out.compile.ok and not out.correct
        text = "\n".join(out.compile.errors)
        assert "model_new.py: refused: model_new.py is a symbolic link to" in text and "outside the workspace" in text
        assert "kernels/sub: refused" in text and "never follow symbolic links" in text
        assert "not built or run" in out.verify.message
        assert not (ws / ".cuda_agent" / "build" / "kernels.so").exists()  # nothing was built
        entry = svc.history[-1]
        assert entry["files"] == {"kernels/axpb.cpp": GOOD} and CANARY not in json.dumps(entry, default=str)
    finally:
        svc.close()
    hist = ws / ".cuda_agent" / "history.jsonl"
    assert CANARY not in hist.read_text()
    st = hist.stat()
    assert st.st_mode & 0o777 == RECORD_MODE and st.st_gid == ws.stat().st_gid


class SwappingCompiler(Compiler):
    """Builds like TinyGxx, but while it builds "the agent" swaps model_new.py for a link
    to a secret and back, as a background process of the agent could."""

    name = "swapping_gxx"
    backend = "cpu"

    def __init__(self, ws: Path, secret: Path):
        super().__init__()
        self.ws, self.secret, self.seen = ws, secret, []

    def build(self, workspace: Path, build_dir: Path | None = None) -> CompileResult:
        self.seen.append(Path(workspace))
        live = self.ws / "model_new.py"
        text = live.read_text()
        live.unlink()
        os.symlink(self.secret, live)
        source = (Path(workspace) / "kernels" / "axpb.cpp").read_text()  # what this build compiles
        live.unlink()
        live.write_text(text)
        assert source == GOOD
        return TinyGxx().build(workspace, build_dir)


def test_a_file_swapped_during_a_run_voids_the_result_and_builds_read_a_private_copy(tmp_path, executor, secret):
    ws = make_ws(tmp_path / "ws")
    comp = SwappingCompiler(ws, secret)
    svc = _service(ws, executor, compiler=comp, compile_in="inline")
    try:
        out = svc.verify()
        assert not out.ok and CHANGED in out.message
        [built] = comp.seen
        assert built != ws and built.parent == ws / ".cuda_agent" and built.name.startswith("sources-")
        assert not built.exists()  # the copy is removed after the build
        assert svc._cache == {}  # no verdict of a changed run is kept for reuse
        assert CANARY not in (ws / ".cuda_agent" / "history.jsonl").read_text()
    finally:
        svc.close()


def test_compile_errors_name_the_workspace_not_the_private_copy(tmp_path, executor):
    ws = make_ws(tmp_path / "ws", kernel='extern "C" double axpb(double x) { return 2.0 * x + ; }\n')
    svc = _service(ws, executor, compile_in="inline")
    try:
        c = svc.compile()
        assert not c.ok and c.errors and all("sources-" not in e for e in c.errors)
        assert "sources-" not in c.log
    finally:
        svc.close()


# --- restore: nothing is written through a link ---------------------------------------------------


def test_restore_removes_links_in_the_way_and_never_writes_through_them(tmp_path):
    ws = workspace(tmp_path)
    target = tmp_path / "target"
    target.mkdir()
    (ws.root / "kernels" / "sub").mkdir()
    (ws.root / "kernels" / "sub" / "a.cpp").write_text("A")
    (ws.root / "model_new.py").write_text("NEW")
    best = ws.snapshot()
    shutil.rmtree(ws.root / "kernels" / "sub")
    os.symlink(target, ws.root / "kernels" / "sub")
    (ws.root / "model_new.py").unlink()
    os.symlink(target / "model_new.py", ws.root / "model_new.py")
    removed = ws.restore(best)
    assert os.listdir(target) == []
    assert sorted(removed) == ["kernels/sub", "model_new.py"]
    assert not (ws.root / "kernels" / "sub").is_symlink() and (ws.root / "kernels" / "sub" / "a.cpp").read_text() == "A"
    assert ws.snapshot() == best
    shutil.rmtree(ws.root / "kernels")
    os.symlink(target, ws.root / "kernels")  # the whole folder swapped for a link
    ws.restore(best)
    assert os.listdir(target) == [] and (ws.root / "kernels").is_dir() and not (ws.root / "kernels").is_symlink()


# --- the cases end to end: `cuda-agent optimize`, both sandboxes ---------------------------

KERNEL = ('#include <cstdint>\nextern "C" void scale3(const float* x, float* y, int64_t n) {\n'
          "  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * 3.0f;\n}\n")
MODEL_NEW = ("import torch\nimport torch.nn as nn\n\nfrom cuda_agent_runtime import load_kernels\n\n"
             "kernels = load_kernels()\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
             "        x = x.contiguous()\n        out = torch.empty_like(x)\n"
             "        kernels.scale3(x, out, x.numel())\n        return out\n")
MODEL = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
         "        return x * 3.0\n\n\ndef get_inputs():\n    return [torch.randn(64, 64)]\n\n\n"
         "def get_init_inputs():\n    return []\n")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_optimize_episode_of_an_adversarial_agent(kind, tmp_path, secret):
    """One episode tries every case: a verified candidate with a sub-folder whose folder is
    then swapped for a link to a root-owned folder (restore_best / profile_best would write
    through it), model_new.py linked to a secret and verified, grep/read through links in
    kernels/, glob out of the workspace, and a preallocated 5 GB file."""
    target = tmp_path / "rootdir"
    target.mkdir()
    model = tmp_path / "scale.py"
    model.write_text(MODEL)
    links = (f"cp model_new.py mine.py && rm -rf kernels/sub && ln -s {target} kernels/sub && "
             f"ln -s {secret} kernels/f.txt && ln -s {secret.parent} kernels/link && ln -sf {secret} model_new.py && "
             "python tools/verify.py")
    script = [
        reply("", [tool_call("write", {"path": "kernels/sub/s.cpp", "content": KERNEL}),
                   tool_call("read", {"path": "model_new.py"})]),
        reply("", [tool_call("write", {"path": "model_new.py", "content": MODEL_NEW})]),
        reply("", [tool_call("bash", {"command": "python tools/verify.py"}, "verify")]),
        reply("", [tool_call("bash", {"command": links}, "links")]),
        reply("", [tool_call("grep", {"pattern": "CANARY"}, "grep"),
                   tool_call("read", {"path": "kernels/f.txt"}, "read"),
                   tool_call("grep", {"pattern": "CANARY", "path": "kernels/link"}, "grep_link"),
                   tool_call("glob", {"pattern": "../../*"}, "glob"),
                   tool_call("glob", {"pattern": "*", "path": "../.."}, "glob_path")]),
        reply("", [tool_call("bash", {"command": "touch kernels/big && fallocate -n -l 5G kernels/big; echo rc=$?; "
                                                 "rm -f kernels/big"}, "disk")]),
        reply("DONE"),
    ]
    out = tmp_path / "out"
    with ScriptedChatServer(script) as server:
        rc = main(["optimize", str(model), "--policy", "openai", "--model", "scripted", "--base-url",
                   server.base_url, "--backend", "cpu", "--out", str(out), "--quiet", f"sandbox.name={kind}",
                   "sandbox.options.disk_mb=512", "environment.profile_best=false"])
    assert rc == 0
    answers = {m["tool_call_id"]: m["content"] for r in server.requests for m in r["messages"]
               if m.get("role") == "tool"}
    # nothing of the secret left the host: not to the model, not into any record
    assert CANARY not in json.dumps(server.requests)
    assert CANARY not in _everything_under(out)
    for name in ("trajectories.jsonl", "transcript.md", "workspace/.cuda_agent/history.jsonl"):
        assert (out / name).stat().st_mode & 0o777 == RECORD_MODE, name
    # nothing was written outside the workspace
    assert os.listdir(target) == []
    assert "VERIFY PASSED" in answers["verify"], answers["verify"]
    refusal = answers["links"]
    assert "model_new.py: refused: model_new.py is a symbolic link to" in refusal, refusal
    assert "outside the workspace" in refusal and "never follow symbolic links" in refusal
    assert "kernels/f.txt: refused" in answers["grep"] and "kernels/link: refused" in answers["grep"]
    assert "kernels/f.txt is a symbolic link to" in answers["read"]
    assert "kernels/link is a symbolic link to" in answers["grep_link"]
    assert "leaves the workspace" in answers["glob"] and "outside the workspace" in answers["glob_path"]
    disk = answers["disk"]
    assert "No space left on device" in disk and "rc=0" not in disk and "[sandbox] the workspace is full" in disk
    # the best version is back as real files, the links in its way removed
    ws = out / "workspace"
    assert (ws / "kernels" / "sub").is_dir() and not (ws / "kernels" / "sub").is_symlink()
    assert (ws / "kernels" / "sub" / "s.cpp").read_text() == KERNEL
    assert not (ws / "model_new.py").is_symlink() and (ws / "model_new.py").read_text() == MODEL_NEW
    assert (out / "best" / "kernels" / "sub" / "s.cpp").read_text() == KERNEL
    assert not os.path.ismount(ws) and not diskfs.stage_of(ws).exists()


# --- the disk --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fs", ["loop", "tmpfs"])
def test_workspace_file_system_bounds_preallocation_and_keeps_the_files(fs, tmp_path):
    if diskfs.choose_kind("auto") == "none" or (fs == "loop" and not diskfs.loop_works()):
        pytest.skip(f"no {fs} file system here (needs root)")
    ws = workspace(tmp_path)
    free0 = shutil.disk_usage(tmp_path).free
    opts = LocalSandbox.Options(disk_mb=48, disk_fs=fs, file_size_mb=8192)  # the file system is the bound
    with LocalSandbox(opts).open(ws.root, ws.protected) as s:
        assert s.disk_fs == fs and os.path.ismount(ws.root)
        r = s.run("touch kernels/big && fallocate -n -l 5G kernels/big; echo rc=$?")
        assert "No space left on device" in r.output and "rc=0" not in r.output, r.output
        # full (loop: ext4 preallocates what fits), or not filled (tmpfs refuses the whole request;
        # the command's own scratch file systems ended with it, so the limits are named)
        assert ("[sandbox] the workspace is full: it holds at most 48 MB" in r.output
                or "no space left on device: the workspace holds at most 48 MB" in r.output), r.output
        assert shutil.disk_usage(tmp_path).free > free0 - (200 << 20)  # the host disk did not grow by 5 GB
        r = s.run("rm -f kernels/big && echo kept > kernels/k.cpp && ln -s /etc/passwd kernels/l && echo fine")
        assert r.exit_code == 0 and "fine" in r.output
    assert not os.path.ismount(ws.root) and not diskfs.stage_of(ws.root).exists()
    assert (ws.root / "kernels" / "k.cpp").read_text() == "kept\n"  # copied back to the disk
    assert os.readlink(ws.root / "kernels" / "l") == "/etc/passwd"  # links stay links
    assert (ws.root / "kernels" / "k.cpp").stat().st_uid != 0  # owners kept


@needs_isolation
def test_sparse_files_count_for_the_watchdog(tmp_path):
    ws = workspace(tmp_path)
    with LocalSandbox(LocalSandbox.Options(disk_mb=48, disk_fs="none", file_size_mb=16)).open(ws.root, ws.protected) as s:
        r = s.run("for i in $(seq 1 8); do truncate -s 15M kernels/s$i; sleep 0.3; done; echo finished", timeout=30)
        assert "finished" not in r.output and "disk limit of 48 MB (sparse files count" in r.output, r.output


def test_disk_fs_option_is_checked(tmp_path):
    ws = workspace(tmp_path)
    with pytest.raises(SandboxError, match="disk_fs must be one of auto, loop, tmpfs, none"):
        LocalSandbox(LocalSandbox.Options(disk_fs="zfs")).open(ws.root, ws.protected)


# --- processes of the agent's shell sessions (local sandbox) ---------------------------------------

ESCAPES = {
    "setsid": "setsid sleep 301 >/dev/null 2>&1 < /dev/null &",
    "double fork": "( ( sleep 302 >/dev/null 2>&1 & ) & )",
    "nohup and disown": "nohup sleep 303 >/dev/null 2>&1 & disown",
    "undumpable new session": ("python3 -c \"import ctypes, os, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "
                               "os.setsid(); time.sleep(304)\" >/dev/null 2>&1 &"),
    # the shell itself becomes a process that left its group, cleared its parent-death
    # signal and hid its /proc folder from its user
    "the shell leaves its group": ("exec python3 -c \"import ctypes, os, time; os.setpgid(0, 0); "
                                   "l = ctypes.CDLL(None); l.prctl(1, 0, 0, 0, 0); l.prctl(4, 0, 0, 0, 0); "
                                   "time.sleep(305)\""),
    "nested namespaces": "unshare --user --pid --fork --mount-proc sleep 306 >/dev/null 2>&1 &",
}


def _alive_after(uid: int, seconds: float = 3.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = processes_of_uid(uid)
        if not left:
            return []
        time.sleep(0.05)
    return processes_of_uid(uid)


@needs_isolation
@pytest.mark.parametrize("escape", list(ESCAPES))
def test_a_shell_sessions_processes_end_with_it(escape, tmp_path):
    ws = workspace(tmp_path)
    s = make_sandbox("local").open(ws.root, ws.protected)
    try:
        uid = s.lease.uid
        ctx = ToolContext(ws.root, protected=ws.protected, spawn=s.spawn)
        sh = ShellSession(ctx)
        sh.proc.stdin.write((ESCAPES[escape] + "\n").encode())  # as the shell tool sends a command
        sh.proc.stdin.flush()
        deadline = time.monotonic() + 10
        while not processes_of_uid(uid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert processes_of_uid(uid)  # the escape is running
        sh.close()
        assert _alive_after(uid) == [], escape
    finally:
        s.close()


@needs_isolation
def test_closing_the_sandbox_ends_and_checks_every_process_of_its_user(tmp_path):
    ws = workspace(tmp_path)
    s = make_sandbox("local").open(ws.root, ws.protected)
    uid = s.lease.uid
    try:
        for cmd in ESCAPES.values():  # each left running, and its shell with it
            s.spawn(["/bin/bash", "--noprofile", "--norc", "-c", cmd + "\nsleep 300"])
        deadline = time.monotonic() + 10
        while len(processes_of_uid(uid)) < len(ESCAPES) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(processes_of_uid(uid)) >= len(ESCAPES)
    finally:
        s.close()  # raises SandboxError when anything survives the sweep
    assert processes_of_uid(uid) == []


@pytest.mark.skipif(not is_root(), reason="needs root")
def test_sweep_kills_and_checks_an_undumpable_process():
    uid = 64999  # a user id of no sandbox
    code = "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); print('hidden', flush=True); time.sleep(60)"
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("needs a system python3 that any user may run")
    p = subprocess.Popen([python, "-c", code], user=uid, group=uid, extra_groups=[], start_new_session=True,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "hidden"
        assert os.stat(f"/proc/{p.pid}/status").st_uid == 0  # undumpable: its /proc files are root's
        assert p.pid in processes_of_uid(uid)
        assert sweep_uid(uid, uid) == []
        assert p.wait(5) == -9
    finally:
        if p.poll() is None:
            p.kill()


@needs_isolation
def test_a_session_cannot_signal_trace_or_read_other_sandboxes_or_the_host(tmp_path):
    a_ws, b_ws = workspace(tmp_path, "a"), workspace(tmp_path, "b")
    with make_sandbox("local").open(a_ws.root, a_ws.protected) as a, \
            make_sandbox("local").open(b_ws.root, b_ws.protected) as b:
        assert a.lease.uid != b.lease.uid
        victim = b.spawn(["sleep", "313"])
        deadline = time.monotonic() + 5
        pids = []
        while not pids and time.monotonic() < deadline:
            pids = [p for p in processes_of_uid(b.lease.uid)
                    if open(f"/proc/{p}/cmdline").read().split("\x00")[:2] == ["sleep", "313"]]
            time.sleep(0.05)
        [b_pid] = pids
        probe = f"""
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
for name, pid in (("b", {b_pid}), ("host", {os.getpid()}), ("hostparent", {os.getppid()})):
    try:
        os.kill(pid, signal.SIGKILL); print(name, "kill: done")
    except OSError as e:
        print(name, "kill:", e.strerror)
    r = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
    print(name, "ptrace:", "attached" if r == 0 else os.strerror(ctypes.get_errno()))
    try:
        with open(f"/proc/{{pid}}/mem", "rb") as f:
            print(name, "mem: read", len(f.read(1)))
    except OSError as e:
        print(name, "mem:", e.strerror)
print("visible:", sorted(open(f"/proc/{{p}}/cmdline").read().split(chr(0))[0] for p in os.listdir("/proc") if p.isdigit()))
"""
        r = a.run(f"python3 - <<'EOF'\n{probe}\nEOF", timeout=30)
        assert r.exit_code == 0, r.output
        for name in ("b", "host", "hostparent"):
            assert f"{name} kill: No such process" in r.output, r.output
            assert f"{name} ptrace: No such process" in r.output, r.output
            assert f"{name} mem: No such file or directory" in r.output, r.output
        assert "sleep" not in r.output.split("visible:")[1]  # b's processes are not even listed
        assert victim.poll() is None  # and b's process is alive


@needs_isolation
def test_sparse_files_are_bounded_by_the_file_size_limit(tmp_path):
    ws = workspace(tmp_path)
    with make_sandbox("local").open(ws.root, ws.protected) as s:
        r = s.run("truncate -s 1G kernels/sparse; echo rc=$?")
        assert "rc=0" not in r.output and "file size limit" in r.output.lower(), r.output
