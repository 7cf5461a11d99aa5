#!/usr/bin/env python3
"""GPU proof of the trainer: PPO steps with a ~0.5B-parameter model through the real agent loop.

    python3 scripts/gpu/ppo_proof.py [--steps 4] [--batch 32] [--max-new-tokens 256]

The model has random weights from a Qwen2 config and a BPE tokenizer trained in-process on
the repo's own text (nothing is downloaded). Every step runs ``--batch`` episodes of the core
agent loop in the CUDA environment (a fresh workspace per episode, the workspace service,
the milestone reward), then one PPO update of actor and critic (GAE, clip 0.2/0.28, value
clipping), exactly the code ``cuda-agent train`` runs. Without deepspeed/vllm installed it
says so and uses the accelerate/torch engine and HF generate. Prints a table at the end:
rollout tokens/s, training tokens/s, seconds per step, peak GPU memory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD", "1")

RELU_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


batch_size = 16
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''


def have(mod: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(mod) is not None


def corpus(repo: Path) -> list[str]:
    texts = []
    for pattern in ("packages/**/*.py", "skills/**/*.md", "tools/*.py", "docs/*.md", "README.md"):
        for p in sorted(repo.glob(pattern)):
            try:
                texts.append(p.read_text(errors="ignore"))
            except OSError:
                pass
    return texts


class ProofEnvironments:
    """The CUDA environment (fresh workspace + service per episode); a folder environment with the
    core tools and the milestone reward when the sandbox package cannot start one."""

    def __init__(self, cfg, pm, workdir: Path):
        from cuda_agent.trainer.envs.cuda import CudaEnvironmentFactory

        self.kind = "cuda"
        self.cuda = CudaEnvironmentFactory(CudaEnvironmentFactory.Options(
            workdir=str(workdir), environment={"evaluate_final": False, "profile_best": False}))
        self.cuda.bind(cfg, pm)
        self.workdir = workdir
        self.pm = pm
        self.errors: list[str] = []

    def make(self, task, dest=None):
        if self.kind == "cuda":
            try:
                return self.cuda.make(task, dest)
            except Exception as exc:  # report and fall back
                self.errors.append(f"{type(exc).__name__}: {exc}")
                self.kind = "folder"
        from cuda_agent.core.agent import FolderEnvironment
        from cuda_agent.core.types import CandidateOutcome

        reward = self.pm.create("reward", {"name": "milestone"})
        ws = Path(tempfile.mkdtemp(dir=self.workdir))
        (ws / "model.py").write_text(task.code)

        def score(traj, env):
            return reward.score(CandidateOutcome())

        return FolderEnvironment(ws, score=score)

    def close(self):
        self.cuda.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32, help="episodes per PPO step (= one mini-batch)")
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--intermediate", type=int, default=4864)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--out", default=None)
    ap.add_argument("--allow-cpu", action="store_true", help="smoke-test on the CPU (tiny sizes)")
    args = ap.parse_args()

    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print("error: no CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    repo = Path(__file__).resolve().parents[2]
    out = Path(args.out or tempfile.mkdtemp(prefix="ppo-proof-"))
    out.mkdir(parents=True, exist_ok=True)
    ds, vl = have("deepspeed"), have("vllm")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0) if cuda else 'CPU'}")
    print(f"deepspeed: {'installed' if ds else 'NOT installed -> training engine: accelerate/torch (bf16 autocast)'}")
    print(f"vllm: {'installed (not used here)' if vl else 'NOT installed -> rollouts: HF generate on the live actor'}")

    from cuda_agent.trainer.tiny import build_tiny_causal_lm, train_bpe_tokenizer

    t0 = time.monotonic()
    tok = train_bpe_tokenizer(corpus(repo), vocab_size=args.vocab)
    model, tok = build_tiny_causal_lm(out / "base", tokenizer=tok, hidden_size=args.hidden, num_layers=args.layers,
                                      num_heads=args.hidden // 64, num_kv_heads=max(1, args.hidden // 256),
                                      intermediate_size=args.intermediate, max_position_embeddings=32768)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    print(f"model: Qwen2 random weights, {n_params / 1e9:.3f}B parameters, vocab {len(tok)}, "
          f"built in {time.monotonic() - t0:.1f}s")

    from omegaconf import OmegaConf

    from cuda_agent.core.config import compose
    from cuda_agent.core.plugins import get_plugin_manager
    from cuda_agent.core.run import Run
    from cuda_agent.core.types import Task
    from cuda_agent.trainer.stages import StageRunner

    overrides = [
        f"run.output_dir={out / 'runs'}", "run.name=ppo_proof", "logging.console=false",
        f"trainer.model.path={out / 'base'}", "trainer.model.dtype=float32",
        # 'no' quoted: YAML reads a bare no as false
        "trainer.engine.backend=auto", "trainer.engine.mixed_precision=" + ("bf16" if cuda else "'no'"),
        f"trainer.engine.device={'cuda' if cuda else 'cpu'}",
        "trainer.engine.gradient_checkpointing=true",
        f"trainer.rollout.max_batch={args.batch}", f"trainer.rollout.concurrency={args.batch}",
        f"trainer.rollout.max_new_tokens={args.max_new_tokens}",
        "trainer.checkpoint.every=0", f"backend={'cuda' if cuda else 'cpu'}",
    ]
    cfg = compose([], overrides)
    cfg.trainer.agent_defaults = OmegaConf.create({
        "max_turns": args.max_turns, "context_tokens": 16384, "max_tokens_per_turn": args.max_new_tokens,
        "check_hooks": True})
    cfg.trainer.stages = OmegaConf.create([{
        "name": "ppo", "steps": args.steps,
        "algorithm": {"name": "ppo", "options": {
            "batch_size": args.batch, "mini_batch_size": args.batch, "micro_batch_size": args.micro, "epochs": 1,
            "actor_lr": 3e-6, "critic_lr": 6e-6, "clip_low": 0.2, "clip_high": 0.28, "gamma": 1.0, "lam": 0.95}}}])
    task = Task(id="relu", source="proof", code=RELU_TASK, name="relu")
    pm = get_plugin_manager()
    envs = ProofEnvironments(cfg, pm, out / "workspaces")
    t_run = time.monotonic()
    with Run(cfg, command="ppo_proof") as run:
        runner = StageRunner(cfg, run, tasks=lambda n, rng: [task] * n, environment=envs, show_progress=False)
        hist = runner.run_all()
    total = time.monotonic() - t_run
    envs.close()
    if envs.errors:
        print(f"note: the CUDA environment could not start ({envs.errors[0]}); "
              "episodes used a folder environment with the core tools and the milestone reward")
    else:
        print("environment: CudaEnvironment (workspace + service per episode), milestone reward")
    print()
    hdr = ("step", "reward", "turns", "prompt_tok", "resp_tok", "rollout_s", "gen_s", "gen_batch", "rollout_tok/s", "train_tok/s", "step_s", "peak_GB",
           "entropy", "clipfrac", "expl_var")
    rows = []
    for h in hist:
        rows.append((str(h["step"]), f"{h.get('reward/mean', float('nan')):.2f}", f"{h.get('turns/mean', 0):.2f}",
                     f"{h.get('prompt/length_mean', 0):.0f}", f"{h.get('response/model_tokens_mean', 0):.0f}", f"{h.get('rollout/seconds', 0):.1f}",
                     f"{h.get('rollout/generate_seconds', 0):.1f}", f"{h.get('rollout/mean_batch', 0):.1f}",
                     f"{h.get('rollout/tokens_per_s', 0):.0f}", f"{h.get('train/tokens_per_s', 0):.0f}",
                     f"{h.get('step_seconds', 0):.1f}", f"{h.get('memory/peak_gb', 0):.1f}",
                     f"{h.get('actor/entropy', float('nan')):.3f}", f"{h.get('actor/clipfrac', float('nan')):.3f}",
                     f"{h.get('critic/explained_variance', float('nan')):.3f}"))
    widths = [max(len(hdr[i]), *(len(r[i]) for r in rows)) for i in range(len(hdr))]
    print("  ".join(h.rjust(w) for h, w in zip(hdr, widths)))
    for r in rows:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths)))
    steady = hist[1:] or hist
    avg = lambda k: sum(h.get(k, 0.0) for h in steady) / len(steady)  # noqa: E731
    print()
    print(f"summary ({len(steady)} steps after the first): rollout {avg('rollout/tokens_per_s'):.0f} tok/s, "
          f"training {avg('train/tokens_per_s'):.0f} tok/s, {avg('step_seconds'):.1f} s/step, "
          f"peak memory {max(h.get('memory/peak_gb', 0) for h in hist):.1f} GB; total {total:.0f}s")
    (out / "proof.json").write_text(json.dumps(hist, indent=1, default=float))
    print(f"metrics: {out / 'proof.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
