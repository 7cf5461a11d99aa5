#!/usr/bin/env python3
"""Multi-GPU proof: the executor pool over every GPU, data-parallel PPO, rollouts next to the pool.

    python3 scripts/gpu/multi_gpu.py                 # a machine with >= 2 GPUs
    python3 scripts/gpu/multi_gpu.py --cpu           # degraded: simulated devices, CPU workers, gloo

(a) pool: the ``local`` executor runs one worker per GPU; the same compiled candidate
    (the workspace example ``axpby``, nvcc) is profiled several times through the pool
    (the real ``profile`` job, cuda_events, baselines off). Reported: jobs per GPU, the
    kernel's median time per GPU and the largest relative difference (must be < 1%).
(b) trainer: one PPO update (actor + critic, accelerate engine, DDP over NCCL) run by
    ``python -m torch.distributed.run`` with one process per GPU, against one process with
    the same global batch. Reported: actor/critic loss, grad norms and a weight checksum
    after the step; they must agree within numerical tolerance. DeepSpeed is used too
    when it is installed (ZeRO-2), else the table says it was not available.
(c) sharing: HF generation of a small random-weight model runs on one GPU (a separate
    process, like a rollout worker) while verify and profile jobs go through the pool on
    every GPU. The generator holds the pool's machine-wide lock of its GPU while it
    generates (released between turns, when an agent would wait for its tools), so pool
    jobs interleave with it. Every job records its start and end inside the worker
    (CLOCK_MONOTONIC, shared by all processes of the machine) and the GPU it ran on; the
    script then checks that no profiling job overlapped any other job or generation turn
    on the same GPU, and reports generation tokens/s.

Prints a table of what ran where; writes ``multi_gpu.json`` under ``$OUT`` when set.
Exit status 1 when a check fails. NCCL_NVLS_ENABLE=0 is kept set for every process.
The same file is the job module of the pool workers (``multi_gpu:timed_job``) and the
entry point of the PPO ranks (``--ppo-worker``) and of the generator (``--generate-worker``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD", "1")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# --- job wrapper (runs inside a pool worker) ----------------------------------------------


def _gpu_identity() -> dict:
    """Which physical GPU this process sees as cuda:0 (bus id, uuid), or {} on the CPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        p = torch.cuda.get_device_properties(0)
        bus = getattr(p, "pci_bus_id", None)
        dom = getattr(p, "pci_domain_id", 0)
        devid = getattr(p, "pci_device_id", 0)
        return {"gpu_name": p.name, "pci": f"{dom:04x}:{bus:02x}:{devid:02x}" if bus is not None else "",
                "uuid": str(getattr(p, "uuid", ""))}
    except Exception as exc:  # identity is for the report only
        return {"gpu_error": str(exc)[:200]}


def timed_job(fn: str, kwargs: dict | None = None, device: str = "") -> dict:
    """Run job function ``fn`` and say when (monotonic clock, inside the worker) and where.

    An exception is returned as text, so the interval of a failed job is known as well."""
    from cuda_agent.sandbox.executors.worker import resolve

    t0 = time.monotonic()
    result, error = None, ""
    try:
        result = resolve(fn)(device=device, **(kwargs or {}))
    except Exception as exc:  # reported with the interval
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    t1 = time.monotonic()
    return {"result": result, "error": error, "start": t0, "end": t1, "pid": os.getpid(), "device": device,
            "label": os.environ.get("CUDA_AGENT_WORKER_DEVICE", ""),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), **_gpu_identity()}


# --- device locks shared with the pool ----------------------------------------------------


def device_lock_path(lock_dir: str, label: str) -> str:
    """The file the pool locks while it runs a job on device ``label`` (see executors/pool.py)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
    return os.path.join(lock_dir, f"device-{safe}.lock")


class DeviceLock:
    """Exclusive use of a device, the same flock the executor pool takes around each job."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.f = open(path, "a+")

    def __enter__(self):
        fcntl.flock(self.f.fileno(), fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.f.fileno(), fcntl.LOCK_UN)


# --- overlap analysis ---------------------------------------------------------------------


def overlapping_pairs(intervals: list[dict]) -> list[tuple[dict, dict]]:
    """Every pair of intervals on the same device that overlap (touching ends do not count).

    Each interval: {"device", "kind", "start", "end", "id"}."""
    pairs = []
    by_dev: dict[str, list[dict]] = {}
    for iv in intervals:
        by_dev.setdefault(iv["device"], []).append(iv)
    for ivs in by_dev.values():
        ivs = sorted(ivs, key=lambda x: x["start"])
        for i, a in enumerate(ivs):
            for b in ivs[i + 1:]:
                if b["start"] >= a["end"]:
                    break
                pairs.append((a, b))
    return pairs


def overlaps(intervals: list[dict]) -> list[tuple[dict, dict]]:
    """Overlapping pairs on one device where at least one is a profiling job."""
    return [(a, b) for a, b in overlapping_pairs(intervals) if "profile" in (a["kind"], b["kind"])]


def any_overlaps(intervals: list[dict]) -> int:
    """Number of overlapping pairs on the same device, whatever their kinds."""
    return len(overlapping_pairs(intervals))


# --- workspace ----------------------------------------------------------------------------


def make_workspace(root: Path, cpu: bool) -> tuple[Path, dict]:
    """A workspace of the template's worked example (axpby) with its correct candidate, compiled."""
    from cuda_agent.core.plugins import get_plugin_manager
    from cuda_agent.core.types import Task
    from cuda_agent.sandbox.workspace.workspace import create_workspace, tools_dir

    compiler = "gxx" if cpu else "nvcc"
    ex = tools_dir() / "template" / compiler / "examples"
    model = (ex / "model.py").read_text()
    # large enough that HBM bandwidth, not launch overhead, sets the time on a GPU; small on the CPU
    model, k = re.subn(r"torch\.randn\(\d+, \d+\)", "torch.randn(256, 1024)" if cpu else "torch.randn(32768, 4096)", model)
    if k != 2:
        raise SystemExit(f"error: unexpected example task in {ex}: input shapes not found")
    ws = create_workspace(Task(id="axpby", source="multi_gpu", code=model), root, backend="cpu" if cpu else "cuda",
                          compiler=compiler)
    files = {"model_new.py": (ex / "model_new.py").read_text()}
    for k in sorted((ex / "kernels").iterdir()):
        files[f"kernels/{k.name}"] = k.read_text()
    ws.restore(files)
    t0 = time.perf_counter()
    comp = get_plugin_manager().create("compiler", {"name": compiler, "options": {}})
    res = comp.build(ws.root)
    if not res.ok:
        raise SystemExit(f"error: the example candidate did not compile with {compiler}: {res.log[-2000:]}")
    return ws.root, {"compiler": compiler, "compile_s": time.perf_counter() - t0}


# --- (a) + (c): the pool --------------------------------------------------------------------


def build_executor(cpu: bool, n: int, lock_dir: str):
    if cpu:
        from cuda_agent.sandbox.executors.local import CpuExecutor, CpuExecutorOptions

        labels = ",".join(f"sim{i}" for i in range(n))
        return CpuExecutor(CpuExecutorOptions(devices=labels, timeout=300, threads=1, spares=1, exclusive=True,
                                              lock_dir=lock_dir))
    from cuda_agent.sandbox.executors.local import LocalExecutor, LocalExecutorOptions

    return LocalExecutor(LocalExecutorOptions(device_count=n, timeout=300, spares=1, exclusive=True, lock_dir=lock_dir))


def submit_timed(ex, fn: str, kwargs: dict, kind: str, label: str):
    from cuda_agent.sandbox.executors import Job

    return ex.submit(Job(fn="multi_gpu:timed_job", kwargs={"fn": fn, "kwargs": kwargs}, kind=kind, label=label))


def collect(futs) -> list[dict]:
    out = []
    for f in futs:
        rec = f.record
        try:
            r = f.result()
        except Exception as exc:  # a job the pool could not run at all
            out.append({"kind": rec.kind, "device": rec.device, "error": f"{type(exc).__name__}: {exc}",
                        "start": rec.started or 0.0, "end": rec.finished or 0.0, "id": rec.job_id, "in_worker": False})
            continue
        res = r["result"]
        out.append({"kind": rec.kind, "device": rec.device, "label": r["label"], "error": r["error"],
                    "start": r["start"], "end": r["end"], "id": rec.job_id, "pid": r["pid"], "in_worker": True,
                    "pci": r.get("pci", ""), "visible": r.get("visible"),
                    "ok": bool(getattr(res, "ok", False)),
                    "message": (getattr(res, "message", "") or r["error"])[:200],
                    "median_ms": (res.candidate.median_ms if getattr(res, "candidate", None) else None),
                    "spread": (res.candidate.spread if getattr(res, "candidate", None) else None)})
    return out


def part_a(ex, ws: Path, n: int, per_device: int, cpu: bool) -> dict:
    """The same kernel profiled on every device through the pool."""
    popts = {"baselines": False, "seed": 0, "perturb_inputs": True}
    if not cpu:
        popts["profiler_options"] = {"target_ms": 600.0}
    futs = [submit_timed(ex, "cuda_agent.sandbox.judge.tasks:profile",
                         {"workspace": str(ws), "options": popts}, "profile", f"timing-{i}")
            for i in range(per_device * n)]
    jobs = collect(futs)
    per: dict[str, dict] = {}
    for dev in ex.devices:
        mine = [j for j in jobs if j["device"] == dev]
        times = [j["median_ms"] for j in mine if j.get("ok") and j.get("median_ms")]
        per[dev] = {"jobs": len(mine), "ok": len(times), "median_ms": statistics.median(times) if times else None,
                    "runs_ms": times, "pci": sorted({j.get("pci", "") for j in mine if j.get("pci")}),
                    "workers": len({j.get("pid") for j in mine if j.get("pid")}),
                    "visible": sorted({str(j.get("visible")) for j in mine})}
    meds = [v["median_ms"] for v in per.values() if v["median_ms"]]
    rel = (max(meds) - min(meds)) / min(meds) if len(meds) == n and min(meds) > 0 else None
    errors = [j["message"] for j in jobs if not j.get("ok")]
    return {"per_device": per, "max_rel_diff": rel, "jobs": jobs, "errors": errors[:5],
            "spread_ok": all(v["jobs"] > 0 for v in per.values()),
            "agree_ok": rel is not None and rel < 0.01}


def part_c(ex, ws: Path, n: int, model_dir: Path, gen_device: str, lock_dir: str, cpu: bool, jobs_per_device: int,
           tmp: Path) -> dict:
    """Generation on one device (its own process) while verify+profile jobs run on every device."""
    out = tmp / "generate.json"
    ready = tmp / "generate.ready"
    stop = tmp / "generate.stop"
    env = dict(os.environ)
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("OMP_NUM_THREADS", "1")
    else:
        env["CUDA_VISIBLE_DEVICES"] = gen_device
    cmd = [sys.executable, str(Path(__file__).resolve()), "--generate-worker", str(model_dir), "cpu" if cpu else "cuda",
           device_lock_path(lock_dir, gen_device), str(out), str(ready), str(stop)]
    gen = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t_wait = time.monotonic()
    while not ready.exists():
        if gen.poll() is not None:
            raise SystemExit(f"error: the generator failed to start:\n{gen.stdout.read()[-3000:]}")
        if time.monotonic() - t_wait > 300:
            gen.kill()
            raise SystemExit("error: the generator did not get ready within 300 s")
        time.sleep(0.1)
    vopts = {"seed": 1, "num_inputs": 2 if cpu else 3}
    popts = {"baselines": not cpu, "compile_baseline": False, "seed": 2, "baseline_cache_dir": str(tmp / "baselines")}
    futs = []
    try:
        for i in range(jobs_per_device * n):
            futs.append(submit_timed(ex, "cuda_agent.sandbox.judge.tasks:verify",
                                     {"workspace": str(ws), "options": vopts}, "verify", f"verify-{i}"))
            futs.append(submit_timed(ex, "cuda_agent.sandbox.judge.tasks:profile",
                                     {"workspace": str(ws), "options": popts}, "profile", f"profile-{i}"))
        jobs = collect(futs)
    finally:
        stop.write_text("stop")  # the generator ends after its current turn
    try:
        log, _ = gen.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        gen.kill()
        log, _ = gen.communicate()
    if gen.returncode != 0 or not out.exists():
        raise SystemExit(f"error: the generator failed (exit {gen.returncode}):\n{log[-3000:]}")
    g = json.loads(out.read_text())
    turns = [{"kind": "generate", "device": gen_device, "start": s, "end": e, "id": f"gen-{i}"}
             for i, (s, e, _tok) in enumerate(g["turns"])]
    intervals = [{"kind": j["kind"], "device": j["device"], "start": j["start"], "end": j["end"], "id": j["id"]}
                 for j in jobs] + turns
    bad = overlaps(intervals)
    span = (g["turns"][0][0], g["turns"][-1][1]) if g["turns"] else (0.0, 0.0)
    during = [j for j in jobs if j["kind"] == "profile" and j["start"] < span[1] and j["end"] > span[0]]
    per: dict[str, dict] = {}
    for dev in ex.devices:
        mine = [j for j in jobs if j["device"] == dev]
        per[dev] = {"verify": sum(j["kind"] == "verify" for j in mine), "profile": sum(j["kind"] == "profile" for j in mine),
                    "ok": sum(bool(j.get("ok")) for j in mine),
                    "generate_turns": len(turns) if dev == gen_device else 0}
    return {"per_device": per, "generator": {k: v for k, v in g.items() if k != "turns"}, "turns": len(turns),
            "jobs_list": jobs, "generation_turns": turns,
            "overlaps": [(a["id"], a["kind"], b["id"], b["kind"], a["device"]) for a, b in bad],
            "overlaps_any_kind": any_overlaps(intervals),
            "profile_jobs_during_generation": len(during),
            "profile_jobs_on_gen_device_during_generation": sum(j["device"] == gen_device for j in during),
            "all_in_worker": all(j["in_worker"] for j in jobs),
            "jobs_ok": sum(bool(j.get("ok")) for j in jobs), "jobs": len(jobs),
            "errors": [j["message"] for j in jobs if not j.get("ok")][:5],
            "no_overlap_ok": not bad and all(j["in_worker"] for j in jobs),
            "concurrent_ok": len(during) > 0 and len(turns) > 0}


def generate_worker(model_dir: str, device: str, lock_path: str, out: str, ready: str, stop: str) -> None:
    """Rollout-style generation: turns of HF generate, each holding the device's lock."""
    import torch
    from transformers import AutoModelForCausalLM

    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype).to(dev).eval()
    vocab = model.config.vocab_size
    batch, prompt_len, new = (16, 128, 128) if dev.type == "cuda" else (2, 16, 16)
    g = torch.Generator().manual_seed(0)
    lock = DeviceLock(lock_path)

    def turn() -> int:
        ids = torch.randint(3, vocab - 1, (batch, prompt_len), generator=g).to(dev)
        with torch.no_grad():
            outp = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                  min_new_tokens=new, do_sample=True, top_k=0, pad_token_id=0)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return int(outp.shape[0] * (outp.shape[1] - prompt_len))

    with lock:
        turn()  # warm-up (kernels, allocator), not reported
    Path(ready).write_text("ready")
    turns = []
    t_first = time.monotonic()
    while not os.path.exists(stop) and time.monotonic() - t_first < 400:
        with lock:
            t0 = time.monotonic()
            tokens = turn()
            t1 = time.monotonic()
        turns.append((t0, t1, tokens))
        time.sleep(0.2)  # the agent would now run its tools; the pool gets the device meanwhile
    busy = sum(e - s for s, e, _ in turns)
    tokens = sum(t for _, _, t in turns)
    wall = (turns[-1][1] - turns[0][0]) if turns else 0.0
    info = {"device": str(dev), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), **_gpu_identity(),
            "batch": batch, "prompt_len": prompt_len, "new_tokens": new, "tokens": tokens,
            "tokens_per_s_generating": tokens / busy if busy else 0.0,
            "tokens_per_s_wall": tokens / wall if wall else 0.0, "busy_fraction": busy / wall if wall else 0.0,
            "turns": turns}
    Path(out).write_text(json.dumps(info))


# --- (b) data-parallel PPO --------------------------------------------------------------------


def ppo_trajectories(n: int, vocab: int, long: bool):
    import random

    from cuda_agent.core.types import RewardResult, Trajectory

    rng = random.Random(7)
    out = []
    for i in range(n):
        plen = (32 if long else 3) + i % 3
        rlen = (96 if long else 5) + 7 * i % 23
        p = [rng.randrange(3, vocab) for _ in range(plen)]
        r = [rng.randrange(3, vocab) for _ in range(rlen)]
        mask = [1, 1, 0, 0] + [1] * (rlen - 4)  # a tool output in the middle (loss mask 0)
        t = Trajectory(id=f"t{i}", task_id=f"task{i % 2}", prompt_ids=p, response_ids=r, loss_mask=mask,
                       rollout_logprobs=[-1.0 if m else 0.0 for m in mask])
        t.reward = RewardResult(value=float(i % 3) - 1.0, reward="x")
        out.append(t)
    return out


def ppo_worker(out_dir: str, model_dir: str, backend: str, device: str, n_traj: int) -> None:
    """One PPO update on fixed trajectories, as one rank of torch.distributed.run (or alone)."""
    import torch

    from cuda_agent.trainer.algorithms import PPO
    from cuda_agent.trainer.engine import EngineOptions, build_engine, rank, world_size
    from cuda_agent.trainer.loop import Trainer
    from cuda_agent.trainer.models import ValueModel, load_causal_lm

    torch.manual_seed(0)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    opts = EngineOptions(backend=backend, zero_stage=2, device=device, mixed_precision="no", gradient_checkpointing=False)
    actor = build_engine(load_causal_lm(model_dir), 1e-4, 1.0, opts)
    critic = build_engine(ValueModel.from_pretrained(model_dir), 1e-4, 1.0, opts)
    vocab = actor.module.config.vocab_size if hasattr(actor.module, "config") else 60
    algo = PPO(PPO.Options(batch_size=n_traj, mini_batch_size=n_traj, micro_batch_size=1, value_clip=0.2))
    trajs = ppo_trajectories(n_traj, vocab, long=(device == "cuda"))
    ws, r = world_size(), rank()
    share = len(trajs) // ws
    mine = trajs[r * share:(r + 1) * share]
    t0 = time.monotonic()
    metrics = Trainer(actor, critic, pad_id=0).update(mine, algo, step=0)
    t1 = time.monotonic()
    sd = actor.full_state_dict()
    csd = critic.full_state_dict()
    dev = actor.device
    res = {"rank": r, "world": ws, "backend": actor.backend, "device": str(dev), "pid": os.getpid(),
           "local_rank": os.environ.get("LOCAL_RANK"), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
           "trajectories": len(mine), "update_s": t1 - t0,
           "metrics": {k: v for k, v in metrics.items() if isinstance(v, float)},
           "actor_sum": float(sum(v.double().abs().sum() for v in sd.values())),
           "critic_sum": float(sum(v.double().abs().sum() for v in csd.values()))}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        res["gpu_name"] = p.name
        bus = getattr(p, "pci_bus_id", None)
        res["pci"] = f"{getattr(p, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(p, 'pci_device_id', 0):02x}" if bus is not None else ""
    Path(out_dir, f"rank{r}.json").write_text(json.dumps(res))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # leave together, then tear the group down
        dist.barrier()
        dist.destroy_process_group()


def run_ppo(model_dir: Path, backend: str, device: str, nproc: int, n_traj: int, tmp: Path) -> dict:
    out = tmp / f"ppo-{backend}-{nproc}"
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD="1", OMP_NUM_THREADS="1", NCCL_NVLS_ENABLE="0")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["DS_ACCELERATOR"] = "cpu"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(Path(__file__).resolve()), "--ppo-worker", str(out), str(model_dir), backend, device, str(n_traj)]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240,
                           start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        out_text = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {"ok": False, "error": f"timed out after 240 s\n{out_text[-3000:]}", "wall_s": 240.0, "cmd": " ".join(cmd)}
    wall = time.monotonic() - t0
    if p.returncode != 0:
        return {"ok": False, "error": p.stdout[-3000:], "wall_s": wall, "cmd": " ".join(cmd)}
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    n = sum(x["trajectories"] for x in ranks)

    def mean(key: str) -> float:  # micro-batches of one trajectory: weight each rank's mean by its count
        return sum(x["metrics"][key] * x["trajectories"] for x in ranks) / n

    return {"ok": True, "nproc": nproc, "backend": ranks[0]["backend"], "wall_s": wall,
            "actor_loss": mean("actor/loss"), "critic_loss": mean("critic/loss"),
            "actor_grad_norm": ranks[0]["metrics"]["actor/grad_norm"],
            "critic_grad_norm": ranks[0]["metrics"]["critic/grad_norm"],
            "actor_sum": ranks[0]["actor_sum"], "critic_sum": ranks[0]["critic_sum"],
            "ranks": [{k: x.get(k) for k in ("rank", "local_rank", "device", "pci", "visible", "pid", "trajectories",
                                              "update_s")}
                      for x in ranks]}


def compare_ppo(dp: dict, one: dict) -> dict:
    tol = {"actor_loss": 1e-4, "critic_loss": 1e-4, "actor_grad_norm": 1e-3, "critic_grad_norm": 1e-3,
           "actor_sum": 1e-5, "critic_sum": 1e-5}
    rows = {}
    ok = dp.get("ok") and one.get("ok")
    for k, t in tol.items():
        if not ok:
            break
        a, b = dp[k], one[k]
        rel = abs(a - b) / max(abs(b), 1e-12)
        rows[k] = {"nproc": a, "one": b, "rel": rel, "tol": t, "ok": rel <= t}
    return {"rows": rows, "ok": bool(ok) and all(r["ok"] for r in rows.values())}


# --- model --------------------------------------------------------------------------------------


def build_model(out: Path, cpu: bool) -> Path:
    from cuda_agent.trainer.tiny import build_tiny_causal_lm

    if cpu:
        build_tiny_causal_lm(out, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                             max_position_embeddings=512)
    else:
        build_tiny_causal_lm(out, hidden_size=512, num_layers=6, num_heads=8, intermediate_size=1408,
                             max_position_embeddings=2048)
    return out


# --- report -------------------------------------------------------------------------------------


def fmt(x, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def where_table(res: dict) -> str:
    """One row per device: what each part ran there (jobs, worker processes, generation, PPO ranks)."""
    a, b, c = res.get("a"), res.get("b"), res.get("c")
    devices = list(res.get("devices") or [])
    if not devices:
        return ""
    rows = [["device", "physical", "(a) profile jobs", "(c) verify", "(c) profile", "(c) generation turns",
             "pool worker pids", "(b) PPO rank"]]
    jobs = (a["jobs"] if a else []) + (c["jobs_list"] if c else [])
    ranks = b["dp"].get("ranks", []) if b and b["dp"].get("ok") else []
    for i, dev in enumerate(devices):
        mine = [j for j in jobs if j["device"] == dev]
        phys = sorted({j.get("pci") or "" for j in mine} - {""})
        pids = sorted({j.get("pid") for j in mine if j.get("pid")})
        rk = [x for x in ranks if (x.get("local_rank") is not None and str(x.get("local_rank")) == str(i))]
        rank_txt = ", ".join(f"rank {x['rank']} ({x['device']}{' ' + x['pci'] if x.get('pci') else ''})" for x in rk)
        rows.append([dev, ",".join(phys) or ("cpu" if res["cpu"] else "?"),
                     str(a["per_device"][dev]["jobs"]) if a else "-",
                     str(c["per_device"][dev]["verify"]) if c else "-",
                     str(c["per_device"][dev]["profile"]) if c else "-",
                     str(c["per_device"][dev]["generate_turns"]) if c else "-",
                     str(len(pids)), rank_txt or "-"])
    return table(rows)


def report(res: dict) -> str:
    out = []
    a, b, c = res.get("a"), res.get("b"), res.get("c")
    kind = "simulated device (CPU worker)" if res["cpu"] else "GPU"
    out.append(f"\n=== multi-GPU proof ({res['mode']}: {res['n']} x {kind}; {res.get('device_name', '')}) ===")
    if a:
        rows = [["(a) pool: device", "jobs", "ok", "kernel median ms", "runs (ms)", "physical (PCI) / workers"]]
        for dev, v in a["per_device"].items():
            rows.append([dev, str(v["jobs"]), str(v["ok"]), fmt(v["median_ms"]),
                         " ".join(fmt(t, ".4f") for t in v["runs_ms"]),
                         ",".join(v["pci"]) or f"cpu, {v['workers']} worker processes"])
        out.append(table(rows))
        out.append(f"max relative difference between devices: {fmt(a['max_rel_diff'] and 100 * a['max_rel_diff'], '.3f')}%"
                   f"  -> jobs on every device: {'PASS' if a['spread_ok'] else 'FAIL'}; within 1%: "
                   f"{'PASS' if a['agree_ok'] else ('FAIL' if not res['cpu'] else 'n/a on CPU (shared cores)')}")
        if a["errors"]:
            out.append(f"errors: {a['errors']}")
    if b:
        out.append("")
        rows = [["(b) PPO step", "N processes", "1 process", "rel diff", "tol", "check"]]
        for k, r in b["compare"]["rows"].items():
            rows.append([k, fmt(r["nproc"], ".8g"), fmt(r["one"], ".8g"), fmt(r["rel"], ".2e"), fmt(r["tol"], ".0e"),
                         "PASS" if r["ok"] else "FAIL"])
        if len(rows) > 1:
            out.append(table(rows))
        dp = b["dp"]
        out.append(f"engine: {b['engine']} ({b['engine_note']}); N={b['nproc']} ranks via python -m torch.distributed.run; "
                   f"wall {fmt(dp.get('wall_s'), '.1f')} s vs {fmt(b['one'].get('wall_s'), '.1f')} s")
        if dp.get("ok"):
            out.append("ranks: " + "; ".join(f"rank {x['rank']} on {x['device']} {x.get('pci') or ''} "
                                             f"({x['trajectories']} traj)" for x in dp["ranks"]))
        for name in ("dp", "one"):
            if not b[name].get("ok"):
                out.append(f"{name} FAILED:\n{b[name].get('error', '')[-1500:]}")
        if b.get("deepspeed"):
            ds = b["deepspeed"]
            out.append(f"DeepSpeed ZeRO-2 N vs 1: {'PASS' if ds['compare']['ok'] else 'FAIL'} "
                       + ", ".join(f"{k} rel {r['rel']:.1e}" for k, r in ds["compare"]["rows"].items()))
        out.append(f"-> same loss with N processes as with 1: {'PASS' if b['compare']['ok'] else 'FAIL'}")
    if c:
        out.append("")
        rows = [["(c) sharing: device", "verify", "profile", "ok", "generate turns"]]
        for dev, v in c["per_device"].items():
            rows.append([dev, str(v["verify"]), str(v["profile"]), str(v["ok"]), str(v["generate_turns"])])
        out.append(table(rows))
        g = c["generator"]
        out.append(f"generation on {res['gen_device']} ({g.get('device')}, batch {g['batch']}, {g['new_tokens']} new tokens/seq): "
                   f"{g['tokens']} tokens, {g['tokens_per_s_generating']:.0f} tokens/s while generating, "
                   f"{g['tokens_per_s_wall']:.0f} tokens/s over the run (device held {100 * g['busy_fraction']:.0f}% of it)")
        out.append(f"profile jobs while generation ran: {c['profile_jobs_during_generation']} "
                   f"({c['profile_jobs_on_gen_device_during_generation']} on the generator's device); "
                   f"jobs ok {c['jobs_ok']}/{c['jobs']}")
        out.append(f"overlapping pairs on one device involving a profile job: {len(c['overlaps'])}; any kind: "
                   f"{c['overlaps_any_kind']}  -> no profiling job shared a device: {'PASS' if c['no_overlap_ok'] else 'FAIL'}; "
                   f"ran concurrently: {'PASS' if c['concurrent_ok'] else 'FAIL'}")
        if c["errors"]:
            out.append(f"errors: {c['errors']}")
    for part, err in (res.get("errors") or {}).items():
        out.append(f"\n({part}) FAILED: {err[:1500]}")
    where = where_table(res)
    if where:
        out.append("\nwhat ran where")
        out.append(where)
    out.append(f"\ntotal {res['total_s']:.0f} s; overall: {'PASS' if res['ok'] else 'FAIL'}")
    return "\n".join(out)


# --- main ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def part_errors(res: dict, part: str):
    """A part that fails is reported (and fails the run) while the other parts still run."""
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit from a part's own checks included
        tb = traceback.format_exc(limit=8)
        res.setdefault("errors", {})[part] = f"{type(exc).__name__}: {exc}"[:3000]
        print(f"[{part}] FAILED: {type(exc).__name__}: {str(exc)[:2000]}\n{tb[-2000:]}", flush=True)


def part_b(model_dir: Path, cpu: bool, n: int, tmp: Path) -> dict:
    """Data-parallel PPO over N processes vs one process with the same global batch."""
    import importlib.util

    device = "cpu" if cpu else "cuda"
    n_traj = 4 * n if cpu else 8 * n
    print(f"[b] PPO step: {n} processes vs 1, global batch {n_traj}", flush=True)
    dp = run_ppo(model_dir, "accelerate", device, n, n_traj, tmp)
    one = run_ppo(model_dir, "accelerate", device, 1, n_traj, tmp)
    b = {"dp": dp, "one": one, "nproc": n, "compare": compare_ppo(dp, one), "engine": "accelerate (DDP)"}
    if importlib.util.find_spec("deepspeed") is None:
        b["engine_note"] = "DeepSpeed not available on this machine"
    else:
        b["engine_note"] = "DeepSpeed installed: ZeRO-2 checked too"
        ds_dp = run_ppo(model_dir, "deepspeed", device, n, n_traj, tmp)
        ds_one = run_ppo(model_dir, "deepspeed", device, 1, n_traj, tmp)
        b["deepspeed"] = {"dp": ds_dp, "one": ds_one, "compare": compare_ppo(ds_dp, ds_one)}
    return b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="simulate devices with CPU workers, gloo for the trainer")
    ap.add_argument("--devices", type=int, default=0, help="devices to use (default: every GPU; 2 with --cpu)")
    ap.add_argument("--jobs-per-device", type=int, default=4, help="(a) profile jobs per device")
    ap.add_argument("--c-jobs-per-device", type=int, default=3, help="(c) verify+profile pairs per device")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: a,b,c")
    args = ap.parse_args()
    t_start = time.monotonic()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    sys.path.insert(0, str(HERE))  # pool workers import this file as ``multi_gpu``

    cpu = args.cpu
    if cpu:
        n = args.devices or 2
        device_name = "CPU"
    else:
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            print(f"error: needs >= 2 GPUs (found {torch.cuda.device_count() if torch.cuda.is_available() else 0}); "
                  "use --cpu for the degraded run", file=sys.stderr)
            return 2
        n = args.devices or torch.cuda.device_count()
        device_name = torch.cuda.get_device_name(0)
    tmp = Path(tempfile.mkdtemp(prefix="multi-gpu-"))
    lock_dir = str(tmp / "locks") if cpu else ""
    res: dict = {"mode": "cpu-simulated" if cpu else "gpu", "cpu": cpu, "n": n, "device_name": device_name}
    try:
        from cuda_agent.sandbox.executors.local import default_lock_dir

        lock_dir = lock_dir or default_lock_dir()
        print(f"[setup] {n} devices, building the workspace and the model in {tmp}", flush=True)
        ws, winfo = make_workspace(tmp / "ws", cpu)
        res["workspace"] = winfo
        model_dir = build_model(tmp / "model", cpu)
        ex = build_executor(cpu, n, lock_dir).start()
        res["devices"] = ex.devices
        try:
            if "a" not in skip:
                print(f"[a] {args.jobs_per_device * n} profile jobs of one kernel over {n} devices", flush=True)
                with part_errors(res, "a"):
                    res["a"] = part_a(ex, ws, n, args.jobs_per_device, cpu)
            if "c" not in skip:
                gen_dev = ex.devices[0]
                res["gen_device"] = gen_dev
                print(f"[c] generation on {gen_dev} with {2 * args.c_jobs_per_device * n} verify/profile jobs", flush=True)
                with part_errors(res, "c"):
                    res["c"] = part_c(ex, ws, n, model_dir, gen_dev, lock_dir, cpu, args.c_jobs_per_device, tmp)
            res["pool_stats"] = ex.stats()
        finally:
            ex.close()
        if "b" not in skip:
            with part_errors(res, "b"):
                res["b"] = part_b(model_dir, cpu, n, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    checks = [False for _ in res.get("errors", {})]
    if res.get("a"):
        checks.append(res["a"]["spread_ok"] and (cpu or res["a"]["agree_ok"]))
    if res.get("b"):
        checks.append(res["b"]["compare"]["ok"] and (not res["b"].get("deepspeed") or res["b"]["deepspeed"]["compare"]["ok"]))
    if res.get("c"):
        checks.append(res["c"]["no_overlap_ok"] and res["c"]["concurrent_ok"])
    res["ok"] = bool(checks) and all(checks)
    res["total_s"] = time.monotonic() - t_start
    text = report(res)
    print(text, flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], "multi_gpu.json").write_text(json.dumps(res, indent=1, default=str))
        Path(os.environ["OUT"], "multi_gpu.txt").write_text(text + "\n")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--ppo-worker":
        ppo_worker(*sys.argv[2:6], int(sys.argv[6]))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # results written: no teardown of background communication threads
    elif len(sys.argv) > 1 and sys.argv[1] == "--generate-worker":
        generate_worker(*sys.argv[2:8])
    else:
        sys.exit(main())
