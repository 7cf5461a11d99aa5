"""Candidate code runs without root rights: real executor worker processes, as root.

A candidate whose forward (or module import) tries to overwrite the baseline cache, the
workspace's model.py or tools/profile.py, or a file in /root or /etc fails with a
PermissionError, its job reports it as failing, and the files are unchanged; an honest
candidate in the same setup still verifies and profiles, and the baseline cache still works.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.core.types import FailureCategory  # noqa: E402
from cuda_agent.sandbox.executors import CpuExecutor, Job  # noqa: E402
from cuda_agent.sandbox.executors.local import CpuExecutorOptions  # noqa: E402
from cuda_agent.sandbox.judge.identity import JOB_UID_BASE, JOB_UID_COUNT  # noqa: E402
from cuda_agent.sandbox.isolation.privdrop import closed_folder, rebase, workspace_user  # noqa: E402
from cuda_agent.sandbox.isolation.sandboxes.common import apply_layout  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_verify_support import hooked_relu_new, make_workspace  # noqa: E402

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="privilege drop needs root on Linux (the jobs keep their rights otherwise)")

T = "cuda_agent.sandbox.judge.tasks:"
FAST = {"target_ms": 5, "warmup_ms": 0, "min_iters": 3, "max_iters": 30}
AGENT_UID = 61999  # stands for the local sandbox's agent user of the workspace

def attack(target: str | list[str], when: str) -> str:
    """A candidate that writes each of ``target`` (at import or in forward). Every write is
    tried; when all are refused it raises the first refusal, so a single write that succeeds
    leaves the candidate running on (and the job passing)."""
    targets = [target] if isinstance(target, str) else list(target)
    tamper = (f"TARGETS = {targets!r}\n\n\ndef _tamper():\n    refused = []\n    for t in TARGETS:\n"
              "        try:\n            with open(t, 'w') as f:\n                f.write('tampered')\n"
              "        except (PermissionError, FileNotFoundError) as exc:\n            refused.append(exc)\n"
              "    if len(refused) == len(TARGETS):\n        raise refused[0]\n")
    return hooked_relu_new(at_import=tamper + ("_tamper()" if when == "import" else ""),
                           in_forward="_tamper()" if when == "forward" else "pass")


@pytest.fixture(scope="module")
def executor():
    ex = CpuExecutor(CpuExecutorOptions(timeout=120.0, warm_plugins=True))
    yield ex
    ex.close()


@pytest.fixture(scope="module", params=["sandbox_user", "fixed_user"])
def setup(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"drop-{request.param}")
    ws = make_workspace(tmp)
    if request.param == "sandbox_user":  # as the local sandbox lays a workspace out as root
        apply_layout(Path(ws.root), ws.protected, AGENT_UID, AGENT_UID)
        assert workspace_user(ws.root) == (AGENT_UID, AGENT_UID)
    else:
        assert workspace_user(ws.root) is None
    cache = tmp / "cache"
    return {"ws": Path(ws.root), "cache": cache, "uid": AGENT_UID if request.param == "sandbox_user" else None}


def check_user(setup, meta: dict) -> None:
    # every job runs its candidate as a user id of its own (not the sandbox's agent user, whose
    # shell processes a job must not be able to signal), from the job range
    assert meta["privileges"].startswith("dropped to uid"), meta.get("privileges")
    assert JOB_UID_BASE <= meta["uid"] < JOB_UID_BASE + JOB_UID_COUNT and meta["gid"] == meta["uid"]
    assert meta["uid"] != AGENT_UID


def popts(setup) -> dict:
    # one timing attempt: what these tests check is who may write, not how steady a timing is
    return {"baseline_cache_dir": str(setup["cache"]), "profiler_options": dict(FAST), "compile_baseline": False,
            "attempts": 1}


def run(executor, fn: str, ws: Path, **kw):
    return executor.run(Job(T + fn, {"workspace": str(ws), **kw}, kind=fn))


def cache_files(setup) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(setup["cache"].rglob("*.json"))}


def test_honest_candidate_verifies_and_profiles_without_root(executor, setup):
    ws = setup["ws"]
    v = run(executor, "verify", ws, options={"seed": 1})
    assert v.ok, v.message
    check_user(setup, v.metadata)
    # forked from its worker (torch imported, no CUDA context), then the job's user all the same
    assert v.metadata["job_started"] == "forked from the job's worker", v.metadata
    assert v.metadata["job_mounts"] == "private" or v.metadata["job_mounts"].startswith("shared")
    p1 = run(executor, "profile", ws, options=popts(setup))
    assert p1.ok, p1.message
    check_user(setup, p1.metadata)
    assert p1.eager is not None and p1.candidate.median_ms > 0
    files = cache_files(setup)
    assert len(files) == 1 and all(os.stat(f).st_uid == 0 for f in files)  # written before the drop
    p2 = run(executor, "profile", ws, options=popts(setup))
    assert p2.ok and p2.metadata["baseline_cache"] == "hit", p2.message
    assert p2.eager.median_ms == p1.eager.median_ms
    v3, p3 = run(executor, "evaluate", ws, verify_options={"seed": 2}, profile_options=popts(setup))
    assert v3.ok and p3 is not None and p3.ok, (v3.message, p3 and p3.message)
    assert p3.metadata["baseline_cache"] == "hit" and p3.eager.median_ms == p1.eager.median_ms
    assert cache_files(setup) == files


@pytest.mark.parametrize("setup", ["fixed_user"], indirect=True)  # the same for either workspace user
def test_a_job_user_without_passwd_entry_still_has_a_name(executor, setup, tmp_path):
    # torch asks getpass.getuser() for its cache folders; the job's uid has no passwd entry
    ws = setup["ws"]
    before = (ws / "model_new.py").read_text()
    code = hooked_relu_new(at_import="import getpass\nNAME = getpass.getuser()",
                           in_forward="assert getpass.getuser() == NAME and NAME.startswith('cuda-agent-job-')")
    (ws / "model_new.py").write_text(code)
    try:
        v = run(executor, "verify", ws, options={"seed": 3})
    finally:
        (ws / "model_new.py").write_text(before)
    assert v.ok, v.message
    check_user(setup, v.metadata)


@pytest.mark.parametrize("setup", ["fixed_user"], indirect=True)  # the same for either workspace user
def test_candidate_code_reaches_no_network(executor, setup):
    # a server on this host's loopback: the candidate's job runs in a network namespace of its own
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    got: list = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            got.append(conn.recv(64))
            conn.close()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    ws = setup["ws"]
    before = (ws / "model_new.py").read_text()
    leak = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')"
    (ws / "model_new.py").write_text(hooked_relu_new(in_forward=leak.replace("\n", "; ")))
    try:
        v = run(executor, "verify", ws, options={"seed": 4})
    finally:
        (ws / "model_new.py").write_text(before)
        stop.set()
        t.join(2)
        srv.close()
    assert not v.ok and v.failure is FailureCategory.CRASH, (v.message, got, v.metadata.get("job_network"))
    assert "unreachable" in v.message or "refused" in v.message, v.message
    assert got == []  # nothing arrived
    assert v.metadata["job_network"] == "none"
    # an honest job on the same footing still verifies
    h = run(executor, "verify", ws, options={"seed": 5})
    assert h.ok and h.metadata["job_network"] == "none", (h.message, h.metadata.get("job_network"))


@pytest.mark.parametrize("setup", ["fixed_user"], indirect=True)  # the same for either workspace user
def test_candidate_sees_a_private_dev_shm(executor, setup):
    # a shared-memory segment of the host (another job's, say) is out of sight and untouched
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    host = Path("/dev/shm") / f"cuda-agent-test-{uuid.uuid4().hex[:8]}"
    host.write_bytes(b"secret")
    ws = setup["ws"]
    before = (ws / "model_new.py").read_text()
    probe = (f"import os; assert not os.path.exists({str(host)!r}), 'host segment visible'; "
             "open('/dev/shm/job-scratch', 'wb').write(b'x')")
    (ws / "model_new.py").write_text(hooked_relu_new(in_forward=probe))
    try:
        v = run(executor, "verify", ws, options={"seed": 6})
    finally:
        (ws / "model_new.py").write_text(before)
    try:
        if v.metadata.get("job_mounts") != "private":
            pytest.skip(f"no private mounts here: {v.metadata.get('job_mounts')}")
        assert v.ok, v.message  # it could write its own /dev/shm, and did not see the host's
        assert host.read_bytes() == b"secret" and not Path("/dev/shm/job-scratch").exists()
    finally:
        host.unlink()


@pytest.mark.parametrize("setup", ["fixed_user"], indirect=True)  # the same for either workspace user
def test_drop_can_be_switched_off(executor, setup):
    v = run(executor, "verify", setup["ws"], options={"seed": 1, "drop_privileges": False})
    assert v.ok and v.metadata["privileges"].startswith("kept (switched off"), v.metadata.get("privileges")


def _targets(setup) -> dict[str, Path]:
    ws = setup["ws"]
    return {
        "model.py": ws / "model.py",
        "tools/profile.py": ws / "tools" / "profile.py",
        "root": Path("/root") / f"cuda-agent-test-{uuid.uuid4().hex[:8]}",
        "etc": Path("/etc") / f"cuda-agent-test-{uuid.uuid4().hex[:8]}",
    }


WHERE = ["baseline_cache", "model.py", "tools/profile.py", "root", "etc"]


# each workspace user once, each moment of the attack once (the user decides what may be written,
# the moment only which job phase reports the refusal)
@pytest.mark.parametrize("setup, when", [("sandbox_user", "forward"), ("fixed_user", "import")], indirect=["setup"])
def test_candidate_cannot_write_outside(executor, setup, when):
    """One candidate tries every target (a baseline record, the read-only task and tool files,
    /root, /etc) in each of its jobs (verify, profile, evaluate): every write must be refused."""
    ws = setup["ws"]
    if not cache_files(setup):  # the baselines exist before the attack
        assert run(executor, "profile", ws, options=popts(setup)).ok
    targets = {"baseline_cache": next(iter(cache_files(setup))), **{k: v for k, v in _targets(setup).items()}}
    assert list(targets) == WHERE
    before = {w: (t.read_bytes() if t.exists() else None) for w, t in targets.items()}
    cache_before = cache_files(setup)
    honest = (ws / "model_new.py").read_text()
    try:
        (ws / "model_new.py").write_text(attack([str(t) for t in targets.values()], when))
        v = run(executor, "verify", ws, options={"seed": 3})
        p = run(executor, "profile", ws, options=popts(setup))
        ev, ep = run(executor, "evaluate", ws, verify_options={"seed": 4}, profile_options=popts(setup))
    finally:
        (ws / "model_new.py").write_text(honest)
    for r in (v, p, ev):
        assert not r.ok  # a single write that went through would have let the candidate pass
        # a file the user may not write, or may not even see (hidden behind a closed folder)
        assert "PermissionError" in r.message or "FileNotFoundError" in r.message, r.message
        assert r.failure == (FailureCategory.COMPILE_ERROR if when == "import" else FailureCategory.CRASH), r.message
        assert r.metadata["privileges"].startswith("dropped"), r.metadata
    assert ep is None
    if when == "import":
        assert "importing model_new.py failed" in v.message
    else:
        assert "ModelNew.forward raised" in v.message and "ModelNew failed while being timed" in p.message
    assert {w: (t.read_bytes() if t.exists() else None) for w, t in targets.items()} == before
    assert cache_files(setup) == cache_before
    again = run(executor, "profile", ws, options=popts(setup))  # still served from the cache afterwards
    assert again.ok and again.metadata["baseline_cache"] == "hit", again.message


def test_the_combined_write_attack_fails_only_when_every_write_is_refused(tmp_path):
    """The attack above is no candidate that always fails: its tamper code, run here, writes
    what it may and raises only when every target refused it."""
    import re

    code = attack([str(tmp_path / "missing" / "x"), str(tmp_path / "allowed")], "forward")
    tamper = re.search(r"TARGETS = .*?raise refused\[0\]\n", code, re.S).group(0)
    scope: dict = {}
    exec(tamper, scope)
    scope["_tamper"]()  # one write went through: no error
    assert (tmp_path / "allowed").read_text() == "tampered"
    scope["TARGETS"] = [str(tmp_path / "missing" / "x"), str(tmp_path / "missing" / "y")]
    with pytest.raises(FileNotFoundError):
        scope["_tamper"]()


def test_rebase_keeps_paths_outside_the_workspace(tmp_path):
    assert rebase(tmp_path / "ws" / "model_new.py", tmp_path / "ws", "/proc/self/fd/7") == Path("/proc/self/fd/7/model_new.py")
    assert rebase(tmp_path / "ref.py", tmp_path / "ws", "/proc/self/fd/7") == tmp_path / "ref.py"


@pytest.mark.parametrize("setup", ["fixed_user"], indirect=True)  # the same for either workspace user
def test_without_a_mount_namespace(setup, monkeypatch):
    """Where no mount namespace can be made the workspace is read through a directory
    handle (past closed parent folders); writes still fail."""
    # a virtual environment's standard library lives under the base installation
    closed = closed_folder(sys.prefix) or closed_folder(sys.base_prefix)
    if closed:
        pytest.skip(f"Python is installed behind {closed}: without a mount namespace the job's user cannot import it")
    monkeypatch.setenv("CUDA_AGENT_JOB_MOUNTS", "0")
    ws = setup["ws"]
    ex = CpuExecutor(CpuExecutorOptions(timeout=120.0, warm_plugins=True, spares=0))
    try:
        v = run(ex, "verify", ws, options={"seed": 5})
        assert v.ok, v.message
        assert v.metadata["job_mounts"].startswith("shared (switched off")
        target = ws / "model.py"
        before = target.read_bytes()
        honest = (ws / "model_new.py").read_text()
        try:
            (ws / "model_new.py").write_text(attack(str(target), "forward"))
            bad = run(ex, "verify", ws, options={"seed": 5})
        finally:
            (ws / "model_new.py").write_text(honest)
        assert not bad.ok and "PermissionError" in bad.message, bad.message
        assert target.read_bytes() == before
    finally:
        ex.close()


def test_scratch_roots_are_never_bound_back(tmp_path, monkeypatch):
    """A worker started from /tmp has it on sys.path; binding it back read-only over the
    job's private /tmp made every job fail with 'Read-only file system'."""
    from cuda_agent.sandbox.isolation.privdrop import _expose_paths

    monkeypatch.setattr(sys, "path", ["", "/tmp", "/", "/var/tmp", str(tmp_path), *sys.path])
    monkeypatch.chdir("/tmp")
    exposed = [p for p, _writable in _expose_paths(tmp_path / "ws")]
    assert not {"/", "/tmp", "/var", "/var/tmp"} & set(exposed), exposed
    assert str(tmp_path) in exposed


def test_the_harness_folders_are_in_the_jobs_view(tmp_path):
    """Every folder our packages import from is bound into a job's mount namespace, also
    where an editable install maps it by a finder (a checkout under /tmp, hidden otherwise)."""
    import cuda_agent

    from cuda_agent.sandbox.isolation import privdrop

    exposed = {p for p, _rw in privdrop._expose_paths(tmp_path)}
    portions = [os.path.abspath(p) for p in cuda_agent.__path__]
    assert portions and all(p in exposed for p in portions), (portions, sorted(exposed))
    assert all(not rw for p, rw in privdrop._expose_paths(tmp_path) if p in portions)  # read-only


def test_a_drop_without_a_workspace_user_leases_its_job_user_held_by_a_root_process(tmp_path):
    """A process that drops to a fallback job user (a dataset check, a task's model check)
    holds that user id as a job does: a file lock that no job's lease can take while the
    process lives, held by a root child of its own, not by a descriptor the dropped code has."""
    import fcntl
    import subprocess
    import time

    from cuda_agent.sandbox.isolation.sandboxes.uids import lock_dir

    code = ("import os, sys, time\n"
            "from cuda_agent.sandbox.isolation import privdrop\n"
            "uid = privdrop.fallback_uid()\n"
            "os.setgid(uid)\n"
            "os.setuid(uid)  # as the drop does: the holder is root, this process no longer\n"
            "def link(f):\n"
            "    try:\n"
            "        return os.readlink(f'/proc/self/fd/{f}')\n"
            "    except OSError:\n"
            "        return ''\n"
            "print(uid, any('uid-' in link(f) for f in os.listdir('/proc/self/fd')), flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        uid, holds = proc.stdout.readline().split()
        uid = int(uid)
        assert JOB_UID_BASE <= uid < JOB_UID_BASE + JOB_UID_COUNT and holds == "False"
        with open(lock_dir() / f"uid-{uid}.lock", "a") as f:
            with pytest.raises(BlockingIOError):  # leased: no job gets this user id
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            proc.kill()
            proc.wait(10)
            deadline = time.monotonic() + 10
            while True:  # the holder ends with the process, and the user id is free again
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, "the lease outlived its process"
                    time.sleep(0.05)
            fcntl.flock(f, fcntl.LOCK_UN)
    finally:
        proc.kill()
