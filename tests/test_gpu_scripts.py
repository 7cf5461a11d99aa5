"""scripts/gpu/run_all.py: what it runs exists, and the carried wheels reach every script."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_ALL = ROOT / "scripts" / "gpu" / "run_all.py"


def load_run_all():
    spec = importlib.util.spec_from_file_location("run_all", RUN_ALL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_listed_script_exists_and_the_list_prints_them():
    run_all = load_run_all()
    missing = sorted(n for n in run_all.SCRIPTS if not (RUN_ALL.parent / f"{n}.py").is_file())
    assert not missing, f"run_all lists scripts that do not exist: {missing}"
    out = subprocess.run([sys.executable, str(RUN_ALL), "--list"], capture_output=True, text=True, check=True).stdout
    assert [line.split()[0] for line in out.splitlines()] == list(run_all.SCRIPTS)


def test_the_carried_wheels_come_first_when_setup_made_them(tmp_path):
    """setup.sh sourced in a pipe loses its PYTHONPATH; run_all puts the wheels' folder back."""
    run_all = load_run_all()
    site = tmp_path / "site"
    assert run_all.with_carried_wheels("/a", site) == "/a"  # not made: nothing added
    site.mkdir()
    assert run_all.with_carried_wheels("", site) == str(site)
    assert run_all.with_carried_wheels(f"/a{os.pathsep}/b", site) == os.pathsep.join([str(site), "/a", "/b"])
    assert run_all.with_carried_wheels(f"/a{os.pathsep}{site}", site) == f"/a{os.pathsep}{site}"  # already there
