"""Our trainer's GRPO step against TRL's GRPOTrainer on the same tiny policy and the same batch.

Both sides get a small Qwen2-style model with the same random weights (bf16 on a GPU), the same
prompts, ``--group`` samples per prompt, exactly ``--new-tokens`` sampled tokens per completion
(end-of-text suppressed in both), the same per-completion rewards, one optimiser update per
step, the same micro-batch. Each side runs in its own process (clean peak memory, no shared
accelerate state), warms up with one step and times the next:

* generation: batched HF ``generate`` of all completions -- our ``ActorPolicy.generate_batch``
  vs TRL's ``_generate``; tokens/s counts sampled tokens;
* training: everything else in the step (old log-probs where needed, the loss's forward and
  backward, the optimiser step) -- our ``Trainer.update`` vs the rest of TRL's step;
  tokens/s counts prompt + completion tokens of the batch;
* peak memory: ``torch.cuda.max_memory_allocated`` over the timed step.

Ours runs with ``use_rollout_logprobs`` (one update per step is on-policy, the sampler's
log-probs are the old ones), as TRL skips that forward in the same case; ``--recompute``
shows the cost of recomputing them.

    python3 scripts/gpu/bench_trainer_vs_trl.py              # GPU, bf16 (~1-2 minutes on an H200)
    python3 scripts/gpu/bench_trainer_vs_trl.py --cpu --tiny # CPU check of the same code (~1 minute)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROMPT = "Write a CUDA kernel for the operator below, then compile, verify and profile it.\n"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="run on the CPU in float32")
    ap.add_argument("--tiny", action="store_true", help="a model and batch small enough for a CPU")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per step (default 16; 2 with --tiny)")
    ap.add_argument("--group", type=int, default=None, help="samples per prompt (default 8; 2 with --tiny)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per completion (default 256; 16 with --tiny)")
    ap.add_argument("--micro", type=int, default=None, help="completions per forward/backward (default: all)")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size (default 896; 64 with --tiny)")
    ap.add_argument("--layers", type=int, default=None, help="layers (default 12; 2 with --tiny)")
    ap.add_argument("--recompute", action="store_true", help="ours: recompute old log-probs instead of the sampler's")
    ap.add_argument("--side", choices=["ours", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    small = a.tiny
    a.prompts = a.prompts or (2 if small else 16)
    a.group = a.group or (2 if small else 8)
    a.new_tokens = a.new_tokens or (16 if small else 256)
    a.hidden = a.hidden or (64 if small else 896)
    a.layers = a.layers or (2 if small else 12)
    a.micro = a.micro or a.prompts * a.group
    return a


def build_model(a, out: Path) -> None:
    """The shared policy: random weights from a Qwen2 config, a tokenizer trained in-process."""
    from cuda_agent.trainer.tiny import build_tiny_causal_lm, train_bpe_tokenizer

    tok = train_bpe_tokenizer([PROMPT * 4, Path(__file__).read_text()], vocab_size=2000)
    heads = max(2, a.hidden // 64)
    build_tiny_causal_lm(out, tokenizer=tok, hidden_size=a.hidden, num_layers=a.layers, num_heads=heads,
                         num_kv_heads=kv_heads_for(heads), max_position_embeddings=4096, seed=0)


def kv_heads_for(heads: int) -> int:
    """Key/value heads for grouped-query attention: the largest divisor of ``heads`` that is at
    most a quarter of it (14 heads -> 2, as Qwen2-0.5B has), all of them below 4 heads."""
    if heads < 4:
        return heads
    return max(d for d in range(1, heads // 4 + 1) if heads % d == 0)


def prompts_of(a) -> list[str]:
    return [f"{PROMPT}Task {i}: y = relu(x) * {i + 2}.0 + 1.0 over a [{64 * (i + 1)}, 256] tensor." for i in range(a.prompts)]


def reward_of(prompt_index: int, sample: int) -> float:
    """The same reward for the same completion slot on both sides (milestone-like values)."""
    return float([-1, 1, 2, 3][(prompt_index * 7 + sample * 3) % 4])


def _device_and_dtype(a):
    import torch

    if a.cpu or not torch.cuda.is_available():
        return torch.device("cpu"), torch.float32
    return torch.device("cuda"), torch.bfloat16


def _peak_reset(dev):
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _peak(dev) -> float | None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**30
    return None


def _load(a, dev, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=dtype).to(dev)
    suppress = sorted({tok.eos_token_id, tok.pad_token_id} - {None})
    return model, tok, suppress


def _sync(dev):
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize()


def run_ours(a) -> dict:
    import torch

    from cuda_agent.core.types import RewardResult, Trajectory
    from cuda_agent.trainer.algorithms.grpo import GRPO, GRPOOptions
    from cuda_agent.trainer.engine import EngineOptions, build_engine
    from cuda_agent.trainer.loop import Trainer
    from cuda_agent.trainer.policy import ActorPolicy

    dev, dtype = _device_and_dtype(a)
    model, tok, suppress = _load(a, dev, dtype)
    model.generation_config.suppress_tokens = suppress  # every completion is new_tokens long
    opts = EngineOptions(backend="accelerate", device=dev.type, mixed_precision="bf16" if dtype == torch.bfloat16 else "no",
                         gradient_checkpointing=False)
    engine = build_engine(model, 1e-6, 1.0, opts)
    n = a.prompts * a.group
    algo = GRPO(GRPOOptions(batch_size=n, group_size=a.group, mini_batch_size=n, micro_batch_size=a.micro,
                            actor_lr=1e-6, use_rollout_logprobs=not a.recompute))
    trainer = Trainer(engine, pad_id=tok.pad_token_id)
    policy = ActorPolicy(engine.module, tok, device=engine.device, max_batch=n, max_new_tokens=a.new_tokens,
                         autocast_dtype=dtype if dev.type == "cuda" else None, seed=0)
    prompt_ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False) for p in prompts_of(a)]
    reqs = [(i, k, list(ids)) for i, ids in enumerate(prompt_ids) for k in range(a.group)]
    out = {}
    for step in range(2):  # step 0 warms up
        torch.manual_seed(step)
        _peak_reset(dev)
        _sync(dev)
        t0 = time.perf_counter()
        results = policy.generate_batch([r[2] for r in reqs], [{"temperature": 1.0, "max_tokens": a.new_tokens}] * n)
        _sync(dev)
        t_gen = time.perf_counter() - t0
        trajs = []
        for (i, k, ids), (resp, lps, _) in zip(reqs, results):
            t = Trajectory(id=f"{i}-{k}", task_id=str(i), prompt_ids=ids, response_ids=list(resp),
                           loss_mask=[1] * len(resp), rollout_logprobs=list(lps))
            t.reward = RewardResult(value=reward_of(i, k), reward="bench")
            t.metadata["group"] = str(i)
            trajs.append(t)
        t1 = time.perf_counter()
        metrics = trainer.update(trajs, algo, step=step)
        _sync(dev)
        t_train = time.perf_counter() - t1
        gen_tokens = sum(len(r[0]) for r in results)
        all_tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
        out = {"gen_s": t_gen, "gen_tokens": gen_tokens, "train_s": t_train, "train_tokens": all_tokens,
               "score_s": metrics.get("train/score_seconds", 0.0), "update_s": metrics.get("train/update_seconds", 0.0),
               "peak_gib": _peak(dev), "loss": metrics.get("actor/loss")}
    return out


def run_trl(a) -> dict:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    dev, dtype = _device_and_dtype(a)
    model, tok, suppress = _load(a, dev, dtype)
    tok.padding_side = "left"
    n = a.prompts * a.group
    prompts = prompts_of(a)
    index = {p: i for i, p in enumerate(prompts)}
    seen: dict[int, int] = {}

    def bench_reward(prompts, completions, **kw):
        values = []
        for p in prompts:
            i = index[p[-1]["content"]]
            k = seen.get(i, 0) % a.group
            seen[i] = seen.get(i, 0) + 1
            values.append(reward_of(i, k))
        return values

    timings = {"gen": [], "gen_tokens": [], "step": [], "peak": []}

    class Timed(GRPOTrainer):
        def _generate(self, prompts):
            _sync(dev)
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            _sync(dev)
            timings["gen"].append(time.perf_counter() - t0)
            timings["gen_tokens"].append(sum(len(c) for c in out[1]))
            return out

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            _peak_reset(dev)
            _sync(dev)
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            _sync(dev)
            timings["step"].append(time.perf_counter() - self.t0)
            timings["peak"].append(_peak(dev))

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts] * 4})
    accum = max(1, n // a.micro)
    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="bench-trl-"), max_steps=2, learning_rate=1e-6,
                      per_device_train_batch_size=a.micro, gradient_accumulation_steps=accum,
                      steps_per_generation=accum, num_generations=a.group, max_completion_length=a.new_tokens,
                      generation_kwargs={"suppress_tokens": suppress}, temperature=1.0, top_k=0,
                      bf16=dtype == torch.bfloat16, use_cpu=dev.type == "cpu", report_to=[], save_strategy="no",
                      logging_steps=1, disable_tqdm=True, seed=0, beta=0.0, loss_type="dapo",
                      shuffle_dataset=False, max_grad_norm=1.0)
    trainer = Timed(model=model, reward_funcs=[bench_reward], args=args, train_dataset=dataset, processing_class=tok,
                    callbacks=[StepClock()])
    trainer.train()
    prompt_tokens = sum(len(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                    tokenize=True, return_dict=False)) for p in prompts) * a.group
    step, gen = timings["step"][-1], timings["gen"][-1]
    loss = [h.get("loss") for h in trainer.state.log_history if "loss" in h]
    return {"gen_s": gen, "gen_tokens": timings["gen_tokens"][-1], "train_s": step - gen,
            "train_tokens": prompt_tokens + timings["gen_tokens"][-1], "peak_gib": timings["peak"][-1],
            "loss": loss[-1] if loss else None}


def child(a) -> None:
    import torch

    torch.manual_seed(0)
    res = run_ours(a) if a.side == "ours" else run_trl(a)
    print("RESULT " + json.dumps(res))


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.side:
        child(a)
        return 0
    import torch

    dev, dtype = _device_and_dtype(a)
    n = a.prompts * a.group
    print(f"policy: Qwen2, hidden {a.hidden}, {a.layers} layers, random weights, {str(dtype).replace('torch.', '')} "
          f"on {dev.type}; batch: {a.prompts} prompts x {a.group} samples = {n} completions x {a.new_tokens} tokens, "
          f"micro-batch {a.micro}, one update", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-trl-model-") as tmp:
        build_model(a, Path(tmp))
        base = [sys.executable, __file__, "--model-dir", tmp] + [x for x in (argv if argv is not None else sys.argv[1:])]
        env = dict(os.environ, TRL_EXPERIMENTAL_SILENCE="1", TOKENIZERS_PARALLELISM="false")
        for side in ("ours", "trl"):
            t0 = time.monotonic()
            proc = subprocess.run(base + ["--side", side], capture_output=True, text=True, env=env, cwd=REPO)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                print(f"{side} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
                return 1
            results[side] = json.loads(line[len("RESULT "):])
            print(f"  {side}: done in {time.monotonic() - t0:.1f} s", flush=True)
    print()
    print(f"| trainer | gen s | gen tok/s | train s | train tok/s | step s | peak GiB |")
    print(f"| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for side, name in (("ours", "cuda-agent"), ("trl", "TRL GRPOTrainer")):
        r = results[side]
        print(f"| {name} | {r['gen_s']:.2f} | {r['gen_tokens'] / r['gen_s']:.0f} | {r['train_s']:.2f} | "
              f"{r['train_tokens'] / r['train_s']:.0f} | {r['gen_s'] + r['train_s']:.2f} | {_fmt(r['peak_gib'], '.2f')} |")
    ours, trl = results["ours"], results["trl"]
    print()
    print(f"ours: training = {ours['score_s']:.2f} s scoring (old log-probs{' recomputed' if a.recompute else ': none'},"
          f" batching) + {ours['update_s']:.2f} s forward/backward/step; {ours['gen_tokens']} vs {trl['gen_tokens']} "
          f"sampled tokens")
    ratio = (trl["gen_s"] + trl["train_s"]) / (ours["gen_s"] + ours["train_s"])
    print(f"step time TRL / ours = {ratio:.2f} ({'ours faster or equal' if ratio >= 1 else 'ours slower'}); "
          f"generation {trl['gen_s'] / ours['gen_s']:.2f}x, training {trl['train_s'] / ours['train_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
