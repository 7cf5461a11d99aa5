"""Collecting trajectories: many episodes of the core agent loop at once.

Episodes run concurrently on one asyncio loop (``concurrency`` at a time): while one
episode's tokens are generated, others run tools, compile, verify or compute rewards.
Each trajectory records its rollout log-probs and a ``group`` (task + step) for GRPO.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cuda_agent.core.agent import AgentOptions, run_episode
from cuda_agent.core.configcheck import bounds
from cuda_agent.core.types import Task, Trajectory


@dataclass
class RolloutOptions:
    """The types and bounds of ``trainer.rollout`` (checked when the config is composed; the
    defaults live in ``configs/trainer.yaml``)."""

    engine: str  # actor (batched HF generate on the trained weights) | policy (the run's policy plugin)
    concurrency: int = field(metadata=bounds(min=1))  # episodes in flight
    max_batch: int = field(metadata=bounds(min=1))  # generation requests batched together
    temperature: float = field(metadata=bounds(min=0.0))
    top_p: float = field(metadata=bounds(min=0.0, max=1.0))
    max_new_tokens: int = field(metadata=bounds(min=1))


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    seconds: float
    generated_tokens: int
    generate_seconds: float
    mean_batch: float = 0.0  # generation requests per batched generate call

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0


async def _collect(tasks: list[Task], policy: Any, make_env: Callable[[Task, int], Any], options: AgentOptions,
                   concurrency: int, samples: int, step: int, on_trajectory: Callable | None,
                   progress: Any, pm: Any) -> list[Trajectory]:
    """Episodes run in waves of ``concurrency``: a wave's environments are made first (in threads,
    together), then all its episodes start at once, so their generation requests batch well."""
    jobs = [(i, t, k) for i, (t, k) in enumerate((t, k) for t in tasks for k in range(samples))]
    size = max(1, concurrency)

    async def one(i: int, task: Task, k: int, env: Any) -> Trajectory:
        try:
            traj = await run_episode(task, policy, env, options, pm=pm)
        finally:
            await asyncio.to_thread(env.close)
        traj.metadata["group"] = f"{task.id}@{step}"
        traj.metadata["sample"] = k
        traj.metadata["step"] = step
        if on_trajectory is not None:
            on_trajectory(traj)
        if progress is not None:
            progress.update(1)
        return traj

    out: list[Trajectory] = []
    for w in range(0, len(jobs), size):
        wave = jobs[w:w + size]
        envs = await asyncio.gather(*(asyncio.to_thread(make_env, t, i) for i, t, _ in wave),
                                    return_exceptions=True)
        failed = next((e for e in envs if isinstance(e, BaseException)), None)
        if failed is not None:
            for e in envs:
                if not isinstance(e, BaseException):
                    await asyncio.to_thread(e.close)
            raise failed
        out.extend(await asyncio.gather(*(one(i, t, k, env) for (i, t, k), env in zip(wave, envs))))
    return out


def collect(tasks: list[Task], policy: Any, make_env: Callable[[Task, int], Any], options: AgentOptions,
            concurrency: int = 64, samples_per_task: int = 1, step: int = 0,
            on_trajectory: Callable | None = None, show_progress: bool = True, pm: Any = None) -> RolloutResult:
    """Run ``samples_per_task`` episodes per task; returns trajectories in task order. ``pm``:
    whose ``check_tool_call`` hook the episodes ask (see :func:`~cuda_agent.core.agent.run_episode`)."""
    progress = None
    if show_progress:
        from tqdm import tqdm

        progress = tqdm(total=len(tasks) * samples_per_task, desc=f"rollout step {step}", leave=False)
    stats0 = policy.reset_stats() if hasattr(policy, "reset_stats") else None
    t0 = time.monotonic()
    try:
        trajs = asyncio.run(_collect(tasks, policy, make_env, options, concurrency, samples_per_task, step,
                                     on_trajectory, progress, pm))
    finally:
        if progress is not None:
            progress.close()
    seconds = time.monotonic() - t0
    del stats0
    stats = policy.reset_stats() if hasattr(policy, "reset_stats") else {}
    gen_tokens = stats.get("generated_tokens") or sum(sum(t.loss_mask) for t in trajs)
    mean_batch = stats.get("calls", 0) / stats["batches"] if stats.get("batches") else 0.0
    return RolloutResult(trajs, seconds, int(gen_tokens), float(stats.get("generate_seconds", 0.0)), mean_batch)


def drop_infra_errors(trajs: list[Trajectory]) -> tuple[list[Trajectory], list[Trajectory]]:
    """``(kept, dropped)``: episodes the infrastructure ended (policy endpoint down after its
    retries) are no sample of the policy; they are dropped from the batch, never rewarded."""
    kept = [t for t in trajs if not t.infra_error]
    return kept, [t for t in trajs if t.infra_error]


def rollout_metrics(trajs: list[Trajectory], max_tokens_per_turn: int | None = None) -> dict:
    """Reward mean and distribution, pass rate, turns, lengths and the clipped-response ratio."""
    import statistics

    if not trajs:
        return {}
    rewards = [t.reward.value if t.reward is not None else 0.0 for t in trajs]
    m: dict[str, float] = {
        "reward/mean": statistics.fmean(rewards),
        "reward/std": statistics.pstdev(rewards),
        "reward/min": min(rewards),
        "reward/max": max(rewards),
        "pass_rate": sum(1 for t in trajs if t.reward is not None and t.reward.correct) / len(trajs),
        "reward/positive_rate": sum(1 for r in rewards if r > 0) / len(trajs),
        "turns/mean": statistics.fmean(len(t.turns) for t in trajs),
        "turns/max": max(len(t.turns) for t in trajs),
        "response/length_mean": statistics.fmean(len(t.response_ids) for t in trajs),
        "prompt/length_mean": statistics.fmean(len(t.prompt_ids) for t in trajs),
        "response/model_tokens_mean": statistics.fmean(sum(t.loss_mask) for t in trajs),
        "response/clipped_ratio": sum(1 for t in trajs if t.finish_reason == "context") / len(trajs),
    }
    for value in sorted(set(rewards)):
        key = f"reward/dist/{value:g}"
        m[key] = sum(1 for r in rewards if r == value) / len(trajs)
    reasons: dict[str, int] = {}
    for t in trajs:
        reasons[t.finish_reason] = reasons.get(t.finish_reason, 0) + 1
    for k, v in reasons.items():
        m[f"finish/{k}"] = v / len(trajs)
    return m


def save_trajectories(trajs: list[Trajectory], path: str | Path) -> None:
    import json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for t in trajs:
            f.write(json.dumps(t.to_dict()) + "\n")
    tmp.replace(path)


def load_trajectories(path: str | Path) -> list[Trajectory]:
    import json

    from cuda_agent.core.agent import trajectory_from_dict

    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(trajectory_from_dict(json.loads(line)))
    return out
