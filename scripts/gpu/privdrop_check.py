"""GPU check: candidate jobs give up root before the candidate runs, and CUDA keeps working.

Run from the repo root on a GPU machine, as root: ``python3 scripts/gpu/privdrop_check.py``.
Through the ``local`` (GPU) executor it profiles an honest candidate twice (the second call
must hit the baseline cache), verifies and profiles a candidate whose forward tries to
overwrite the workspace's model.py, one that writes the baseline cache, and one that opens
a connection to a server on the host's loopback (the job has no network). Prints a table;
writes the results as JSON under ``$OUT`` when set.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in ("core", "sandbox"):
    sys.path.insert(0, str(ROOT / "packages" / p / "src"))

TASK = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.relu(x) * 2.0

    def get_inputs():
        return [torch.randn(4096, 4096)]

    def get_init_inputs():
        return []
''')

CANDIDATE = textwrap.dedent('''
    import torch
    import torch.nn as nn
    TARGET = {target!r}

    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            if TARGET.startswith("tcp:"):
                import socket
                socket.create_connection(("127.0.0.1", int(TARGET[4:])), timeout=2).sendall(b"leak")
            elif TARGET:
                with open(TARGET, "w") as f:
                    f.write("tampered")
            return torch.relu(x) * 2.0
''')


def main() -> int:
    import torch

    from cuda_agent.core.types import Task
    from cuda_agent.sandbox.executors import Job, LocalExecutor
    from cuda_agent.sandbox.executors.local import LocalExecutorOptions
    from cuda_agent.sandbox.workspace.workspace import create_workspace

    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="privdrop-check-"))
    ws = create_workspace(Task(id="relu2", source="check", code=TASK), tmp / "ws", backend="cuda")
    root = Path(ws.root)
    cache = tmp / "cache"
    popts = {"baseline_cache_dir": str(cache), "compile_baseline": True}
    vopts = {"static_checks": []}
    rows = []
    ex = LocalExecutor(LocalExecutorOptions(timeout=300, device_count=1))

    def job(fn, **kw):
        t0 = time.time()
        try:
            r = ex.run(Job("cuda_agent.sandbox.judge.tasks:" + fn, {"workspace": str(root), **kw}, kind=fn))
        except Exception as exc:  # a JobError says why
            return None, f"{type(exc).__name__}: {exc}", time.time() - t0
        return r, "", time.time() - t0

    def row(case, r, err, secs, expect_ok):
        md = getattr(r, "metadata", {}) or {}
        ok = bool(getattr(r, "ok", False))
        rows.append({"case": case, "ok": ok, "as_expected": ok == expect_ok and not err,
                     "privileges": md.get("privileges"), "mounts": md.get("job_mounts"),
                     "cache": md.get("baseline_cache"), "message": (err or getattr(r, "message", ""))[:160],
                     "seconds": round(secs, 1)})

    try:
        (root / "model_new.py").write_text(CANDIDATE.format(target=""))
        r, err, s = job("profile", options=popts)
        row("honest profile (1st)", r, err, s, True)
        r, err, s = job("profile", options=popts)
        row("honest profile (2nd, cache hit)", r, err, s, True)
        rows[-1]["as_expected"] = rows[-1]["as_expected"] and rows[-1]["cache"] == "hit"
        r, err, s = job("verify", options=vopts)
        row("honest verify (torch ops, no static checks)", r, err, s, True)
        # the run-time guard may reject torch ops in forward: what counts is that it ran dropped
        rows[-1]["as_expected"] = not err and str(rows[-1]["privileges"]).startswith("dropped") \
            and not any(w in rows[-1]["message"] for w in ("Permission", "KeyError", "not found"))
        model_before = (root / "model.py").read_bytes()
        (root / "model_new.py").write_text(CANDIDATE.format(target=str(root / "model.py")))
        r, err, s = job("profile", options=popts)
        row("writes model.py (profile)", r, err, s, False)
        rows[-1]["as_expected"] = rows[-1]["as_expected"] and (root / "model.py").read_bytes() == model_before
        files = sorted(cache.rglob("*.json"))
        before = {f: f.read_bytes() for f in files}
        (root / "model_new.py").write_text(CANDIDATE.format(target=str(files[0]) if files else "/etc/x"))
        r, err, s = job("profile", options=popts)
        row("writes the baseline cache (profile)", r, err, s, False)
        rows[-1]["as_expected"] = rows[-1]["as_expected"] and {f: f.read_bytes() for f in files} == before
        import socket

        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        srv.settimeout(0.5)
        (root / "model_new.py").write_text(CANDIDATE.format(target=f"tcp:{srv.getsockname()[1]}"))
        r, err, s = job("profile", options=popts)
        row("connects to a host server (profile)", r, err, s, False)
        try:
            conn, _ = srv.accept()
            conn.close()
            reached = True
        except OSError:
            reached = False
        srv.close()
        rows[-1]["as_expected"] = rows[-1]["as_expected"] and not reached \
            and (getattr(r, "metadata", {}) or {}).get("job_network") == "none"
    finally:
        ex.close()
    out = os.environ.get("OUT")
    if out:
        Path(out, "privdrop_check.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'case':45} {'ok':5} {'expected':8} {'cache':5} privileges / mounts / message")
    for x in rows:
        print(f"{x['case']:45} {str(x['ok']):5} {str(x['as_expected']):8} {str(x['cache']):5} "
              f"{x['privileges']} / {x['mounts']} / {x['message']}")
    return 0 if all(x["as_expected"] for x in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
