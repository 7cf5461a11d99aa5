"""Rollout generation on the CPU: vLLM's CPU build against HF ``generate``, side by side.

Both engines sample the same batch of prompts from the same tiny random model (float32,
temperature 1), the way the trainer samples rollouts: vLLM through the in-process ``vllm``
policy (``generate_batch``), HF through the trainer's actor policy (one left-padded batched
``generate`` with the logits kept for log-probs). Prints tokens per second per engine, the
agreement of vLLM's log-probs with an HF forward pass over the same ids, and the time of one
weight sync (write the weights, load them in every worker, drop the prefix cache): in process,
and through ``vllm serve`` over loopback HTTP unless ``--no-server``.

    python3 scripts/bench_vllm_cpu.py                      # about 2-3 minutes on 2 cores
    python3 scripts/bench_vllm_cpu.py --models 128x2 --batch 16 --new-tokens 64 --no-server

Needs vLLM (``bash scripts/install_vllm.sh``) and the trainer package.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROW_MARK = "bench_vllm_cpu row: "


def parse_models(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        hidden, layers = part.lower().split("x")
        if int(hidden) % 64:
            raise SystemExit(f"--models: hidden size {hidden} is not a multiple of 64 (heads of 64 each)")
        out.append((int(hidden), int(layers)))
    return out


def prompts_for(tokenizer, batch: int, length: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    vocab = [i for i in range(len(tokenizer)) if i not in special]
    return [[rng.choice(vocab) for _ in range(length)] for _ in range(batch)]


def timed(fn, repeats: int) -> tuple[float, list]:
    """Median seconds over ``repeats`` calls after one untimed warm-up call; the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench_hf(folder: Path, args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cuda_agent.trainer.policy import ActorPolicy

    tok = AutoTokenizer.from_pretrained(folder)
    prompts = prompts_for(tok, args.batch, args.prompt_tokens, args.seed)
    sampling = [{"max_tokens": args.new_tokens, "temperature": 1.0}] * args.batch
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    actor = ActorPolicy(model, tok, device="cpu", max_batch=args.batch, max_new_tokens=args.new_tokens)
    secs, outs = timed(lambda: actor.generate_batch(prompts, sampling), args.repeats)
    tokens = sum(len(o[0]) for o in outs)
    return {"hf_tokens": tokens, "hf_tok_s": tokens / secs}


def bench_vllm(folder: Path, args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from cuda_agent.core.policies.vllm import VLLMPolicy

    pol = VLLMPolicy(VLLMPolicy.Options(
        model=str(folder), dtype="float32", max_model_len=args.prompt_tokens + args.new_tokens + 16,
        max_new_tokens=args.new_tokens, seed=args.seed,
        engine_args={"enforce_eager": True, "kv_cache_memory_bytes": 256 << 20, "distributed_executor_backend": "uni"}))
    row: dict = {}
    try:
        prompts = prompts_for(pol.tokenizer, args.batch, args.prompt_tokens, args.seed)
        sampling = [{"max_tokens": args.new_tokens, "temperature": 1.0}] * args.batch
        secs, outs = timed(lambda: pol.generate_batch(prompts, sampling), args.repeats)
        row["vllm_tokens"] = sum(len(o[0]) for o in outs)
        row["vllm_tok_s"] = row["vllm_tokens"] / secs
        # the token-in/token-out contract on this batch: an HF forward pass over vLLM's ids
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        worst = 0.0
        with torch.no_grad():
            for p, (ids, lps, _) in zip(prompts, outs):
                if ids:
                    logits = model(input_ids=torch.tensor([p + ids])).logits[0, len(p) - 1:-1].float()
                    ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
                    worst = max(worst, float((ref - torch.tensor(lps)).abs().max()))
        row["max_logprob_diff"] = worst
        state = {k: v.clone() for k, v in model.state_dict().items()}
        row["params_mb"] = sum(v.numel() * v.element_size() for v in state.values()) / 2 ** 20
        row["sync_inprocess_s"], _ = timed(lambda: pol.update_weights(iter(state.items())), args.repeats)
    finally:
        pol.close()
    if args.server:
        row["sync_server_s"] = server_sync(folder, state, args)
    return row


def server_sync(folder: Path, state: dict, args) -> float:
    """One weight sync through a ``vllm serve`` process on loopback (median of the repeats)."""
    from cuda_agent.core.policies.vllm_launch import VLLMServe, cpu_args
    from cuda_agent.core.policies.vllm_server import VLLMServerPolicy

    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    with VLLMServe(folder, extra=cpu_args(64 << 20, args.prompt_tokens + args.new_tokens + 16), env=env) as server:
        with tempfile.TemporaryDirectory(prefix="bench-sync-") as sync_dir:
            pol = VLLMServerPolicy(VLLMServerPolicy.Options(base_urls=[server.url], model=str(folder),
                                                            weight_sync_dir=sync_dir))
            secs, _ = timed(lambda: pol.update_weights(iter(state.items())), args.repeats)
    return secs


def run_worker(engine: str, folder: Path, argv: list[str]) -> dict:
    """This script again with ``--worker ENGINE``: each engine is timed in a fresh process (a
    process that has imported vllm runs HF generate of a tiny model several times slower)."""
    cmd = [sys.executable, __file__, *argv, "--worker", engine, "--model-dir", str(folder)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench_vllm_cpu: the {engine} run failed (exit {proc.returncode})")
    rows = [line[len(ROW_MARK):] for line in proc.stdout.splitlines() if line.startswith(ROW_MARK)]
    return json.loads(rows[-1])


def table(rows: list[dict], threads: int) -> str:
    head = ("| model | batch x (prompt + new tokens) | HF generate tok/s | vLLM CPU tok/s | vLLM / HF "
            "| max abs log-prob diff | weight sync in process | weight sync via vllm serve |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        server = f"{r['sync_server_s'] * 1000:.0f} ms" if "sync_server_s" in r else "-"
        lines.append(
            f"| {r['model']} ({r['params_mb']:.1f} MB) | {r['batch']} x ({r['prompt_tokens']} + {r['new_tokens']}) "
            f"| {r['hf_tok_s']:.0f} | {r['vllm_tok_s']:.0f} | {r['vllm_tok_s'] / r['hf_tok_s']:.1f}x "
            f"| {r['max_logprob_diff']:.1e} | {r['sync_inprocess_s'] * 1000:.0f} ms | {server} |")
    lines.append(f"\n(float32, temperature 1, {threads} CPU threads, median of the timed repeats after a warm-up)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="128x2,512x4", help="hidden x layers, comma-separated (heads of 64)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-server", dest="server", action="store_false", help="skip the sync through vllm serve")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--worker", choices=["hf", "vllm"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    models = parse_models(args.models)
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # not imported here: see run_worker
        print("bench_vllm_cpu: vLLM is not installed (bash scripts/install_vllm.sh)", file=sys.stderr)
        return 1
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # vLLM would lower torch's threads to 1 otherwise
    import torch

    torch.set_num_threads(args.threads)
    if args.worker:  # one engine, in a process of its own
        row = (bench_hf if args.worker == "hf" else bench_vllm)(Path(args.model_dir), args)
        print(ROW_MARK + json.dumps(row), flush=True)
        return 0
    from cuda_agent.core.policies.tiny import build_tiny_model

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        for hidden, layers in models:
            name = f"Qwen2 {hidden}x{layers}"
            folder = build_tiny_model(Path(tmp) / f"m{hidden}x{layers}", hidden_size=hidden, num_layers=layers,
                                      num_heads=hidden // 64, seed=args.seed)
            row = {"model": name, "batch": args.batch, "prompt_tokens": args.prompt_tokens,
                   "new_tokens": args.new_tokens}
            for engine in ("hf", "vllm"):
                print(f"== {name}: {engine}", file=sys.stderr, flush=True)
                row.update(run_worker(engine, folder, argv if argv is not None else sys.argv[1:]))
            rows.append(row)
    print(table(rows, args.threads))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":  # vLLM starts its processes by spawn: this module is imported again there
    # the engine inside this process, its threads left where torch put them (as HF's)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    raise SystemExit(main())
