"""scripts/gpu/run_all.py: what it runs exists, and the carried wheels reach every script."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def _reference_record(task_id: str, eager_ms: float, cand_ms: float, charged: float = 0.0,
                      methods: tuple[str, str] = ("cuda_events", "cuda_events")) -> dict:
    level = int(task_id[1])
    profile = {"baseline_cache": "hit", "phase_seconds": {},
               "timing_methods": {"eager": methods[0], "candidate": methods[1]}}
    if charged:
        profile["timing_charged"] = {"rule": "timing.wall-clock", "charged_ms_per_call": charged}
    return {"task_id": task_id, "level": level, "name": task_id.split("/", 1)[1], "correct": True, "failure": "none",
            "message": "", "t_candidate_ms": cand_ms, "t_eager_ms": eager_ms, "t_compile_ms": None,
            "speedup_vs_eager": eager_ms / cand_ms, "speedup_vs_compile": None, "candidates": 1, "source": "",
            "seconds": 3.0, "metadata": {"profile": profile}}


def test_merged_references_count_those_within_two_percent_and_those_charged(tmp_path):
    """eval_references --merge: the table counts the references within 2% of 1x (the target)
    beside those within 10%, and lists the ones the trusted clock charged and the ones whose
    eager and candidate loops ran differently."""
    import json

    run = tmp_path / "run"
    run.mkdir()
    oom = dict(_reference_record("L1/4_D", 2.0, 2.0), correct=False, failure="crash",
               message="out of memory (OutOfMemoryError: CUDA out of memory. Process 11 has 40.00 GiB memory in use.")
    oom["metadata"] = {"verify": {"gpu_memory_holders": {"11": "40.00 GiB: the spare worker of cuda:0"}}}
    records = [_reference_record("L1/1_A", 2.0, 2.01),
               _reference_record("L1/2_B", 2.0, 2.1, methods=("cuda_events+graph+sync", "cuda_events+graph")),
               _reference_record("L1/3_C", 20.0, 29.0, charged=9.0), oom]
    records[1]["metadata"]["profile"]["baseline_timed_in"] = "a candidate's process"
    records[2]["metadata"]["profile"]["baseline_as_candidate_error"] = "the reference timed as a candidate failed: boom"
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    script = ROOT / "scripts" / "gpu" / "eval_references.py"
    env = {**os.environ, "OUT": str(tmp_path / "out")}  # the merged report's folder
    out = subprocess.run([sys.executable, str(script), "--merge", str(run)], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    header = next(line for line in out.stdout.splitlines() if line.startswith("level"))
    assert "within 2% of eager" in header and "within 10% of eager" in header
    row = next(line for line in out.stdout.splitlines() if line.startswith("L1 ")).split()
    assert row[1:3] == ["4", "3"] and row[-2:] == ["1", "2"]  # within 2%: A; within 10%: A and B
    assert "charged by timing.wall-clock (a reference never should be): 1: L1/3_C: +9 ms" in out.stdout
    assert "L1/4_D ran out of GPU memory; held by: 11 40.00 GiB: the spare worker of cuda:0" in out.stdout
    assert ("candidate and eager loops ran differently: 1: L1/2_B: eager cuda_events+graph+sync, "
            "candidate cuda_events+graph") in out.stdout
    assert "baselines_timed_as_candidates 1" in " ".join(out.stdout.split())
    assert ("baselines that could not be timed as candidates (trusted timing kept): 1: L1/3_C: the reference "
            "timed as a candidate failed: boom") in out.stdout
    assert (tmp_path / "out" / "summary.json").is_file()


@pytest.mark.parametrize("name,count", [("references_recheck.txt", 71), ("references_graph.txt", 26)])
def test_the_recheck_lists_name_kernelbench_tasks_once_each(name, count):
    """scripts/gpu/references_*.txt, read as --ids-file reads them: ids of KernelBench's form,
    no repeats, merged with --ids; each one a task file where KernelBench is at hand."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("eval_references", ROOT / "scripts" / "gpu" / "eval_references.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    listed = ROOT / "scripts" / "gpu" / name
    ids = mod.ids_wanted(None, str(listed))
    assert len(ids) == len(set(ids)) == count
    assert all(i[:2] in ("L1", "L2", "L3") and i[2] == "/" and "#" not in i for i in ids)
    assert mod.ids_wanted("L1/19_ReLU, L2/1_*", str(listed))[:2] == ["L1/19_ReLU", "L2/1_*"]
    env = os.environ.get("CUDA_AGENT_KERNELBENCH")
    kb = next((p for p in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "kernelbench"]
               if (p / "level1").is_dir()), None)
    if kb is not None:
        missing = [i for i in ids if not (kb / f"level{i[1]}" / f"{i[3:]}.py").is_file()]
        assert not missing, missing
