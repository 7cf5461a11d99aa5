#!/usr/bin/env python3
"""SmolLM2-135M-Instruct served by the in-process ``vllm`` policy (vLLM's CPU build) as the
trainer's rollout engine: do its sampled log-probs agree with the trainer's scoring, and do
weights pushed after training change what it samples?

    python scripts/real_model_vllm.py --weights runs/real-model/train/stages/00-warmup/final/actor

Runs ``--episodes`` agent episodes (the compact prompt of held-out easy tasks, a plain folder
with the task's files, no judge) sampled by the engine at ``--temperature`` with the converted
model's weights, scores every sampled token again as the trainer does
(:func:`cuda_agent.trainer.agreement.agreement`), pushes the weights of ``--weights`` (a trained
actor folder, e.g. the warm-up's) through ``update_weights``, and does it again against those
weights. Prints one table and writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # a shared machine: no pinned threads
TOOLS = ["bash", "read", "write", "todo"]


def episodes(engine, tasks, root: Path, temperature: float, max_turns: int, max_tokens: int):
    from cuda_agent.core.agent import AgentOptions, FolderEnvironment, run_episode_sync
    from cuda_agent.core.agent.environment import build_tools
    from cuda_agent.trainer.expert import CompactPrompt, model_new_source

    out = []
    for i, task in enumerate(tasks):
        path = root / f"{i:02d}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "model.py").write_text(task.code)
        (path / "model_new.py").write_text(model_new_source(task.metadata["reduce"]))
        env = CompactPrompt(FolderEnvironment(path, tools=build_tools(TOOLS), protected=["model.py"]))
        try:
            out.append(run_episode_sync(task, engine, env, AgentOptions(
                max_turns=max_turns, context_tokens=4096, max_tokens_per_turn=max_tokens, min_generation_tokens=8,
                sampling={"temperature": temperature}, check_hooks=False)))
        finally:
            env.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", default="runs/real-model/train/stages/00-warmup/final/actor",
                    help="a trained actor folder whose weights are pushed into the engine")
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--kv-cache-mb", type=int, default=512)
    ap.add_argument("--out", default="runs/real-model-vllm.json")
    args = ap.parse_args()
    weights = Path(args.weights)
    if not (weights / "config.json").exists():
        print(f"error: --weights {weights} is not a model folder (run scripts/real_model.py first, or give "
              "a trained actor folder)", file=sys.stderr)
        return 2

    import torch
    from transformers import AutoModelForCausalLM

    from cuda_agent.core.errors import CudaAgentError
    from cuda_agent.core.models import get_model
    from cuda_agent.core.policies.vllm import VLLMPolicy
    from cuda_agent.trainer.agreement import agreement
    from cuda_agent.trainer.expert import easy_tasks

    try:
        base_dir = get_model("smollm2-135m")
    except CudaAgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # vLLM's CPU attention wants one thread a core
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32).eval()
    trained = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32).eval()
    pool = easy_tasks(1)
    tasks = [t for t in pool if t.category == "elementwise"][: args.episodes - args.episodes // 2]
    tasks += [t for t in pool if t.category == "reduction"][: args.episodes // 2]

    t0 = time.monotonic()
    engine = VLLMPolicy(VLLMPolicy.Options(
        model=str(base_dir), dtype="float32", max_model_len=4096, seed=0, max_new_tokens=args.max_new_tokens,
        max_batch=1, engine_args={"enforce_eager": True, "kv_cache_memory_bytes": args.kv_cache_mb << 20,
                                  "distributed_executor_backend": "uni"}))
    start_s = time.monotonic() - t0
    pad = engine.tokenizer.pad_token_id or 0
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="real-model-vllm-") as tmp:
            prompt = None
            for label, model in (("converted weights", base), ("after the push", trained)):
                if model is trained:
                    t1 = time.monotonic()
                    state = trained.state_dict()
                    loaded = engine.update_weights(iter(state.items()))
                    push_s = time.monotonic() - t1
                t1 = time.monotonic()
                trajs = episodes(engine, tasks, Path(tmp) / label.replace(" ", "-"), args.temperature,
                                 args.max_turns, args.max_new_tokens)
                seconds = time.monotonic() - t1
                prompt = prompt or trajs[0].prompt_ids
                greedy = asyncio.run(engine.generate(prompt, {"max_tokens": 24, "temperature": 0.0}))[0]
                own = agreement(model, trajs, args.temperature, pad)
                other = agreement(base if model is trained else trained, trajs, args.temperature, pad)
                generated = sum(sum(t.loss_mask) for t in trajs)
                rows.append({"weights": label, "episodes": len(trajs), **own.as_dict(),
                             "other_weights_max_abs": other.max_abs, "generated_tokens": generated,
                             "tokens_per_s": generated / seconds, "greedy": engine.tokenizer.decode(greedy),
                             "parsed_calls": sum(1 for t in trajs for tt in t.turns for c in tt.tool_calls
                                                 if not c.error)})
                print(f"[{label}] {json.dumps(rows[-1])}", flush=True)
    finally:
        engine.close()
    changed = rows[0]["greedy"] != rows[1]["greedy"]
    result = {"rows": rows, "engine_start_seconds": start_s, "push_seconds": push_s, "tensors_loaded": loaded,
              "greedy_changed": changed, "temperature": args.temperature, "weights": str(weights)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print()
    head = ("weights", "tokens", "max |dlogp|", "mean |dlogp|", "max |dlogp| vs other weights", "tok/s")
    lines = [(r["weights"], str(r["tokens"]), f"{r['max_abs']:.2e}", f"{r['mean_abs']:.2e}",
              f"{r['other_weights_max_abs']:.2f}", f"{r['tokens_per_s']:.1f}") for r in rows]
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    for line in [head, *lines]:
        print(" | ".join(c.ljust(w) for c, w in zip(line, widths)))
    print(f"\nengine start {start_s:.1f} s; weight push {push_s:.1f} s ({loaded} tensors); greedy answer "
          f"{'changed' if changed else 'UNCHANGED'} after the push")
    return 0


if __name__ == "__main__":
    sys.exit(main())
