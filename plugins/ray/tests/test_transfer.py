"""What travels with a job: a workspace packed on the client and unpacked on a node is the
same workspace (files, modes, build), the client's live state stays behind, nothing can
be written outside the destination, and results read with the client's paths again."""

from __future__ import annotations

import os
import pickle
import socket
import stat
import zlib
from pathlib import Path

import pytest

from cuda_agent.core.types import FailureCategory, VerifyResult
from cuda_agent_ray.transfer import TransferError, pack, rebase, remove_tree, unpack, write_tree


def _workspace(root: Path) -> Path:
    (root / "kernels").mkdir(parents=True)
    (root / "tools").mkdir()
    (root / ".cuda_agent" / "build").mkdir(parents=True)
    (root / ".cuda_agent" / "tmp").mkdir()
    (root / "model.py").write_text("class Model: pass\n")
    (root / "model_new.py").write_text("class ModelNew: pass\n")
    (root / "kernels" / "add.cpp").write_text('extern "C" void add() {}\n')
    (root / "tools" / "verify.py").write_text("print('verify')\n")
    (root / ".cuda_agent" / "workspace.json").write_text("{}")
    (root / ".cuda_agent" / "build" / "manifest.json").write_text('{"ok": true, "artifact": "k.so"}')
    (root / ".cuda_agent" / "build" / "k.so").write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
    (root / ".cuda_agent" / "tmp" / "scratch").write_text("x")
    (root / ".cuda_agent" / "history.jsonl").write_text("{}\n")
    (root / ".cuda_agent" / "build.lock").write_text("")
    os.symlink("/etc/hostname", root / "kernels" / "link.cpp")
    (root / "model.py").chmod(0o444)
    (root / "tools" / "verify.py").chmod(0o444)
    (root / "tools").chmod(0o555)
    return root


def test_roundtrip_keeps_files_modes_and_build(tmp_path):
    ws = _workspace(tmp_path / "ws")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(ws / ".cuda_agent" / "service.sock"))  # the live service's socket
    try:
        blob = pack(ws)
    finally:
        sock.close()
    out = unpack(blob, tmp_path / "node" / "ws")
    try:
        got = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
        assert got == [".cuda_agent/build/k.so", ".cuda_agent/build/manifest.json", ".cuda_agent/workspace.json",
                       "kernels/add.cpp", "model.py", "model_new.py", "tools/verify.py"]
        assert (out / ".cuda_agent" / "build" / "k.so").read_bytes() == (ws / ".cuda_agent" / "build" / "k.so").read_bytes()
        assert stat.S_IMODE((out / "model.py").stat().st_mode) == 0o444
        assert stat.S_IMODE((out / "tools").stat().st_mode) == 0o555
        assert not (out / "kernels" / "link.cpp").exists()  # a link never travels
    finally:
        remove_tree(tmp_path / "node")
        (ws / "tools").chmod(0o755)


def test_unsafe_or_oversized_blobs_are_refused(tmp_path):
    evil = zlib.compress(pickle.dumps({"format": 1, "root_mode": 0o755, "dirs": [],
                                       "files": [("../escaped.txt", 0o644, 0, 0, b"x")]}))
    with pytest.raises(TransferError, match="unsafe path"):
        unpack(evil, tmp_path / "dest")
    assert not (tmp_path / "escaped.txt").exists()
    with pytest.raises(TransferError, match="not a workspace blob"):
        unpack(b"garbage", tmp_path / "dest2")
    ws = _workspace(tmp_path / "ws")
    with pytest.raises(TransferError, match="more than 0.000954 MiB.*max_transfer_mb"):
        pack(ws, max_bytes=1000)
    (ws / "tools").chmod(0o755)


def test_write_tree_replaces_the_build_folder(tmp_path):
    ws = tmp_path / "ws"
    (ws / ".cuda_agent" / "build").mkdir(parents=True)
    (ws / ".cuda_agent" / "build" / "old.so").write_bytes(b"old")
    write_tree(ws, {".cuda_agent/build/new.so": b"new", ".cuda_agent/build/manifest.json": b"{}"}, ".cuda_agent/build")
    assert sorted(p.name for p in (ws / ".cuda_agent" / "build").iterdir()) == ["manifest.json", "new.so"]
    with pytest.raises(TransferError):
        write_tree(ws, {"model.py": b"x"}, ".cuda_agent/build")


def test_rebase_rewrites_node_paths_in_results():
    v = VerifyResult(ok=False, failure=FailureCategory.CRASH, message="/n/job-1/ws/model_new.py:3: boom",
                     metadata={"files": ["/n/job-1/ws/kernels/a.cpp"], "root": "/n/job-1/ws", "n": 3})
    r = rebase(v, "/n/job-1/ws", "/home/me/ws")
    assert isinstance(r, VerifyResult) and r.failure is FailureCategory.CRASH
    assert r.message == "/home/me/ws/model_new.py:3: boom"
    assert r.metadata == {"files": ["/home/me/ws/kernels/a.cpp"], "root": "/home/me/ws", "n": 3}
    assert rebase("nothing to do", "/n/job-1/ws", "/x") == "nothing to do"
