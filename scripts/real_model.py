#!/usr/bin/env python3
"""A real pretrained model through the whole loop, on the CPU backend: SmolLM2-135M-Instruct
before training, after the warm-up (rejection fine-tuning on expert trajectories) and after
agentic PPO with the judge's milestone reward, on held-out easy tasks.

    python scripts/real_model.py                 # the table (about 80 minutes on 2 idle cores)
    python scripts/real_model.py --sft-steps 4 --ppo-steps 1 --heldout 8 --out runs/real-quick

Prints one table (parseable turns, episodes with a compiled / verified candidate, mean reward)
and writes ``<out>/results.json``, ``<out>/ppo_reward.png`` (the PPO reward curve) and the
trainer's run folder (``<out>/train``). Data: the expert trajectories are episodes of
:class:`cuda_agent.trainer.expert.ScriptedExpert` on synthesised training tasks, plus the
recorded episode of ``cuda-agent demo``, run through the real loop and scored by the judge;
training tasks are decontaminated against the held-out ones (AST similarity at most 0.9,
``cuda_agent.datasets.synthesis.similarity``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TOOLS = ["bash", "read", "write", "todo"]


def split_tasks(n_heldout: int, n_train: int, seed: int):
    """Held-out tasks (half element-wise, half reductions, chains of one or two operators) and
    training tasks (chains of up to three operators) none of which is more than 0.9 similar to a
    held-out one, alternating element-wise and reduction tasks."""
    from cuda_agent.datasets.synthesis.similarity import Decontaminator
    from cuda_agent.trainer.expert import easy_tasks

    pool = easy_tasks(seed)
    elem = [t for t in pool if t.category == "elementwise"]
    red = [t for t in pool if t.category == "reduction"]
    heldout = elem[: n_heldout - n_heldout // 2] + red[: n_heldout // 2]
    held_ids = {t.id for t in heldout}
    decon = Decontaminator.from_codes([(t.id, t.code) for t in heldout], threshold=0.9)
    kinds: dict[str, list] = {}
    dropped = 0
    # chains of one or two operators first; most short element-wise ones are too similar to a
    # held-out task, and chains of three operators make up the rest
    long = [t for t in easy_tasks(seed, max_ops=3) if len(t.metadata["ops"]) == 3]
    for kind in ("elementwise", "reduction"):
        kinds[kind] = []
        for t in [t for t in pool + long if t.category == kind and t.id not in held_ids]:
            if len(kinds[kind]) >= n_train:
                break
            if decon.is_contaminated(t.code)[0]:
                dropped += 1
                continue
            kinds[kind].append(t)
    train = [t for pair in zip(kinds["elementwise"], kinds["reduction"]) for t in pair][:n_train]
    return heldout, train, dropped


def environment(backend_overrides: list[str]):
    from cuda_agent.core.config import compose
    from cuda_agent.core.plugins import get_plugin_manager
    from cuda_agent.trainer.expert import CompactPromptFactory

    pm = get_plugin_manager()
    cfg = compose([], ["backend=cpu", "environment.profile_best=false",
                       f"environment.tools=[{','.join(TOOLS)}]", *backend_overrides], pm=pm)
    factory = pm.create("environment", {"name": "cuda", "options": {}})
    factory.bind(cfg, pm)
    return cfg, pm, CompactPromptFactory(factory)


def agent_options(max_turns: int, temperature: float, max_new_tokens: int = 640):
    from cuda_agent.core.agent import AgentOptions

    return AgentOptions(max_turns=max_turns, context_tokens=3072, max_tokens_per_turn=max_new_tokens,
                        min_generation_tokens=32,
                        sampling={"temperature": temperature}, check_hooks=False)


def run_episodes(tasks, policy, factory, options, concurrency: int = 8):
    from cuda_agent.trainer.rollout import collect

    res = collect(tasks, policy, lambda t, i: factory.make(t, None), options, concurrency=concurrency,
                  samples_per_task=1, step=0, show_progress=False)
    return res.trajectories


def episode_row(traj) -> dict:
    turns = traj.turns
    calls = [c for t in turns for c in t.tool_calls]
    ran = [r for t in turns for r in t.tool_results if r.ok]
    well_formed = sum(1 for t in turns if (t.tool_calls and not any(c.error for c in t.tool_calls))
                      or (not t.tool_calls and t.assistant.strip().upper().endswith("DONE")))
    compiled = any(c.outcome.compile is not None and c.outcome.compile.ok for c in traj.candidates)
    verified = any(c.outcome.correct for c in traj.candidates)
    return {"task": traj.task_id, "turns": len(turns), "parseable_turns": well_formed,
            "tool_calls": len(calls), "parsed_calls": sum(1 for c in calls if not c.error), "calls_ran": len(ran),
            "compiled": compiled, "verified": verified, "finish": traj.finish_reason,
            "reward": traj.reward.value if traj.reward is not None else None,
            "first_reply": (turns[0].assistant[:160] if turns else ""),
            # what it wrote and what came back, turn by turn, to drill into a failed episode
            "transcript": [{"assistant": t.assistant[:4000],
                            "calls": [f"{c.name} {json.dumps(c.arguments)[:3000]}" for c in t.tool_calls],
                            "results": [f"{r.name}: {r.content[:600]}" for r in t.tool_results]} for t in turns]}


def summary(rows: list[dict]) -> dict:
    turns = sum(r["turns"] for r in rows)
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    return {"episodes": len(rows), "parseable_turns": sum(r["parseable_turns"] for r in rows) / max(turns, 1),
            "parsed_calls": sum(r["parsed_calls"] for r in rows), "tool_calls": sum(r["tool_calls"] for r in rows),
            "compiled": sum(r["compiled"] for r in rows), "verified": sum(r["verified"] for r in rows),
            "mean_reward": statistics.fmean(rewards) if rewards else float("nan")}


def evaluate(model_dir: Path, tasks, factory, label: str, args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cuda_agent.trainer.policy import ActorPolicy

    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(args.device).eval()
    policy = ActorPolicy(model, tok, max_batch=len(tasks), temperature=0.0, max_new_tokens=args.max_new_tokens)
    trajs = run_episodes(tasks, policy, factory, agent_options(args.max_turns, 0.0, args.max_new_tokens),
                         concurrency=len(tasks))
    del model, policy
    rows = [episode_row(t) for t in trajs]
    out = {"label": label, "model": str(model_dir), "rows": rows, **summary(rows),
           "seconds": round(time.monotonic() - t0, 1)}
    print(f"[{label}] {json.dumps({k: v for k, v in out.items() if k != 'rows'})}", flush=True)
    return out


def expert_data(tasks, factory, tokenizer, out: Path, max_turns: int) -> dict:
    """Expert episodes on the training tasks and the demo's recorded episode, through the real
    loop and judge, saved as token-exact trajectories."""
    from cuda_agent.sandbox.workspace.optimize import demo_paths, read_task
    from cuda_agent.trainer.expert import ScriptedExpert, expert_turns, recorded_turns
    from cuda_agent.trainer.rollout import save_trajectories

    demo_model, demo_recording = demo_paths("cpu")
    demo = read_task(demo_model)
    demo_turns = recorded_turns(demo_recording)

    def turns_for(code: str):
        return demo_turns if code.strip() == demo.code.strip() else expert_turns(code)

    expert = ScriptedExpert(tokenizer, turns_for)
    trajs = run_episodes([demo, *tasks], expert, factory, agent_options(max(max_turns, len(demo_turns) + 1), 0.0),
                         concurrency=2)
    save_trajectories(trajs, out)
    rewards = [t.reward.value if t.reward else None for t in trajs]
    return {"episodes": len(trajs), "demo_reward": rewards[0], "positive": sum(1 for r in rewards if r and r > 0),
            "mean_response_tokens": statistics.fmean(len(t.response_ids) for t in trajs),
            "mean_prompt_tokens": statistics.fmean(len(t.prompt_ids) for t in trajs)}


def train(model_dir: Path, data: Path, tasks, factory, pm, out: Path, args) -> list[dict]:
    """The warm-up (RFT on the expert data) and agentic PPO, by the trainer's stages; the config
    is written to ``<out>.yaml`` first."""
    import yaml

    from cuda_agent.core.config import compose
    from cuda_agent.core.run import Run
    from cuda_agent.trainer.stages import StageRunner

    stages = [
        {"name": "warmup", "algorithm": {"name": "rft", "options": {
            "source": "file", "trajectories": str(data), "batch_size": args.sft_batch, "mini_batch_size": args.sft_batch,
            "micro_batch_size": 1, "epochs": 1, "actor_lr": args.sft_lr, "min_reward": 0.0}},
         "steps": args.sft_steps},
        {"name": "ppo", "algorithm": {"name": "ppo", "options": {
            "batch_size": args.ppo_batch, "mini_batch_size": args.ppo_batch, "micro_batch_size": 1, "epochs": 1,
            "actor_lr": args.ppo_lr, "critic_lr": args.critic_lr, "gamma": 1.0, "lam": 0.95,
            "temperature": args.ppo_temperature}},
         "steps": args.ppo_steps, "critic_init": "actor"},
    ]
    trainer = {"model": {"path": str(model_dir), "dtype": "float32"},
               "engine": {"backend": "accelerate", "mixed_precision": "no", "device": args.device,
                          "gradient_checkpointing": False, "train_layers": args.train_layers},
               "rollout": {"concurrency": args.ppo_batch, "max_batch": args.ppo_batch,
                           "max_new_tokens": args.max_new_tokens, "temperature": args.ppo_temperature},
               "environment": {"name": "cuda", "options": {}},
               "agent_defaults": {"max_turns": args.max_turns, "context_tokens": 3072,
                                  "max_tokens_per_turn": args.max_new_tokens, "min_generation_tokens": 32,
                                  "check_hooks": False},
               "checkpoint": {"every": 1, "keep": 1}, "max_length": 3072, "stages": stages}
    config = out.with_suffix(".yaml")
    config.write_text(yaml.safe_dump({"run": {"name": "real-model"}, "backend": "cpu",
                                      "environment": {"profile_best": False, "tools": TOOLS}, "trainer": trainer},
                                     sort_keys=False))
    cfg = compose([config], [], pm=pm)
    run = Run(cfg, command="train", pm=pm, dir=out)
    pool = list(tasks)

    def sample(n, rng):
        return [rng.choice(pool) for _ in range(n)]

    with run:
        runner = StageRunner(cfg, run, pm=pm, show_progress=False, tasks=sample, environment=factory)
        history = runner.run_all()
    return history


def plot(rewards: list[float], path: Path) -> list[float]:
    """The PPO stage's mean reward per step, drawn with Pillow (a PNG)."""
    from PIL import Image, ImageDraw

    w, h, m = 560, 340, 50
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    lo, hi = -1.0, 3.0  # the milestone reward's range
    d.rectangle([m, m // 2, w - m // 2, h - m], outline="black")
    for v in (-1, 0, 1, 2, 3):
        y = h - m - (v - lo) / (hi - lo) * (h - 1.5 * m)
        d.line([m - 4, y, m, y], fill="black")
        d.text((m - 30, y - 6), f"{v:+d}", fill="black")
    n = max(len(rewards) - 1, 1)
    pts = [(m + i / n * (w - 1.5 * m), h - m - (r - lo) / (hi - lo) * (h - 1.5 * m))
           for i, r in enumerate(rewards) if r == r]
    for i, (x, _y) in enumerate(pts):
        d.text((x - 3, h - m + 6), str(i), fill="black")
    if len(pts) > 1:
        d.line(pts, fill=(31, 119, 180), width=2)
    for x, y in pts:
        d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=(31, 119, 180))
    d.text((m, 4), "SmolLM2-135M: mean milestone reward per PPO step (CPU backend)", fill="black")
    d.text((w // 2 - 30, h - 18), "PPO step", fill="black")
    img.save(path)
    return rewards


def print_table(results: list[dict]) -> None:
    head = ("model", "parseable turns", "compiled", "verified", "mean reward", "episodes")
    rows = [(r["label"], f"{100 * r['parseable_turns']:.0f}%", f"{r['compiled']}/{r['episodes']}",
             f"{r['verified']}/{r['episodes']}", f"{r['mean_reward']:+.2f}", str(r["episodes"])) for r in results]
    widths = [max(len(str(x[i])) for x in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)))


def ppo_curve(run_dir: Path) -> list[float]:
    """The PPO stage's mean reward per step, from the run's metrics (the last record of a step
    that a resumed run did again)."""
    by_step: dict[int, float] = {}
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                m = json.loads(line)
            except ValueError:  # a line cut short by a kill
                continue
            if m.get("stage") == 1.0 and "reward/mean" in m:
                by_step[int(m["stage_step"])] = float(m["reward/mean"])
    return [by_step[k] for k in sorted(by_step)]


def rise(curve: list[float]) -> dict:
    """How far the PPO reward rose: the mean of the last half of the steps against the first
    step (the warm-up's start), and the spread of the reward from one step to the next (the
    standard deviation of the step-to-step changes)."""
    if len(curve) < 2:
        return {}
    late = curve[len(curve) // 2:]
    steps = [b - a for a, b in zip(curve, curve[1:])]
    spread = statistics.pstdev(steps) if len(steps) > 1 else abs(steps[0])
    return {"start": curve[0], "last_half_mean": statistics.fmean(late), "rise": statistics.fmean(late) - curve[0],
            "step_to_step_spread": spread}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/real-model")
    ap.add_argument("--resume", action="store_true", help="keep what an earlier run in --out measured and trained")
    ap.add_argument("--heldout", type=int, default=8)
    ap.add_argument("--train-tasks", type=int, default=80, help="tasks the expert solves for the warm-up")
    ap.add_argument("--ppo-tasks", type=int, default=32, help="other tasks, for PPO's rollouts")
    ap.add_argument("--sft-steps", type=int, default=40)
    ap.add_argument("--sft-batch", type=int, default=4)
    ap.add_argument("--sft-lr", type=float, default=2e-4)
    ap.add_argument("--ppo-steps", type=int, default=4)
    ap.add_argument("--ppo-batch", type=int, default=4)
    ap.add_argument("--ppo-lr", type=float, default=1e-5)
    ap.add_argument("--critic-lr", type=float, default=5e-5)
    ap.add_argument("--ppo-temperature", type=float, default=1.0)
    ap.add_argument("--train-layers", type=int, default=16)
    ap.add_argument("--max-turns", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="where the model runs (cpu, cuda); the judge stays on the CPU backend")
    ap.add_argument("--max-new-tokens", type=int, default=640, help="generation cap of one turn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--eval-only", metavar="MODEL_DIR",
                    help="only run this model on the held-out tasks and print each episode's turns")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from cuda_agent.core.errors import CudaAgentError
    from cuda_agent.core.models import get_model

    out = Path(args.out).resolve()
    if (out / "results.json").exists() and not args.resume:
        print(f"error: {out} holds an earlier run; give --resume to continue it or another --out", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    try:
        base = get_model("smollm2-135m")
    except CudaAgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    heldout, tasks, dropped = split_tasks(args.heldout, args.train_tasks + args.ppo_tasks, args.seed)
    train_tasks, ppo_tasks = tasks[: args.train_tasks], tasks[args.train_tasks:]
    print(f"held-out {len(heldout)}: {[t.id for t in heldout]}\nexpert {len(train_tasks)}, PPO {len(ppo_tasks)} "
          f"({dropped} synthesised tasks dropped as too similar to a held-out one)", flush=True)
    _cfg, pm, factory = environment([])
    if args.eval_only:
        try:
            res = evaluate(Path(args.eval_only), heldout, factory, "eval-only", args)
        finally:
            factory.close()
        for row in res["rows"]:
            print(f"\n=== {row['task']}: finish {row['finish']}, reward {row['reward']}")
            for i, turn in enumerate(row["transcript"]):
                print(f"--- turn {i}\n{turn['assistant']}")
                for c in turn["calls"]:
                    print(f"  call {c}")
                for r in turn["results"]:
                    print(f"  -> {r}")
        (out / "eval-only.json").write_text(json.dumps(res, indent=1, default=str))
        return 0
    earlier = json.loads((out / "results.json").read_text()) if args.resume and (out / "results.json").exists() else {}
    done = {r["label"]: r for r in earlier.get("results", [])}
    results: list[dict] = []
    info = {"heldout": [t.id for t in heldout], "train": [t.id for t in train_tasks], "ppo": [t.id for t in ppo_tasks],
            "decontaminated": dropped, "args": vars(args), "command": " ".join(sys.argv)}
    for key in ("expert", "train_seconds"):
        if key in earlier:
            info[key] = earlier[key]

    def save() -> None:  # after every phase: a run stopped halfway keeps what it measured
        (out / "results.json").write_text(json.dumps({"results": results, **info}, indent=1, default=str))

    def phase(label: str, model_dir: Path) -> None:
        results.append(done[label] if label in done else evaluate(model_dir, heldout, factory, label, args))
        save()

    try:
        if not args.skip_baseline:
            phase("untrained", base)
        tok = AutoTokenizer.from_pretrained(str(base))
        data = out / "expert.jsonl"
        if not (data.exists() and "expert" in info):
            t0 = time.monotonic()
            info["expert"] = expert_data(train_tasks, factory, tok, data, args.max_turns)
            info["expert"]["seconds"] = round(time.monotonic() - t0, 1)
            save()
        print(f"[expert] {json.dumps(info['expert'])}", flush=True)
        stages = out / "train" / "stages"
        if not (stages / "01-ppo" / "final").exists():
            t0 = time.monotonic()
            train(base, data, ppo_tasks, factory, pm, out / "train", args)
            info["train_seconds"] = round(time.monotonic() - t0, 1) + float(info.get("train_seconds") or 0)
        info["ppo_reward_curve"] = plot(ppo_curve(out / "train"), out / "ppo_reward.png")
        info["ppo_rise"] = rise(info["ppo_reward_curve"])
        save()
        phase("after warm-up", stages / "00-warmup" / "final" / "actor")
        phase("after PPO", stages / "01-ppo" / "final" / "actor")
    finally:
        factory.close()
        save()
    print()
    print_table(results)
    print(f"\nPPO mean reward per step: {[round(r, 3) for r in info['ppo_reward_curve']]}")
    if info["ppo_rise"]:
        r = info["ppo_rise"]
        print(f"PPO: first step {r['start']:+.2f}, mean of the last half {r['last_half_mean']:+.2f} "
              f"(rise {r['rise']:+.2f}); step-to-step spread {r['step_to_step_spread']:.2f}")
    print(f"plot: {out / 'ppo_reward.png'}\nresults: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
