"""A training run: an ordered list of stages, each starting from the previous stage's weights.

The paper's pipeline (the default preset, ``configs/paper.yaml``): single-turn PPO
warm-up (32k context) -> rejection fine-tuning on agent trajectories -> critic value
pretraining on the trajectories RFT kept -> multi-turn agentic PPO.

Every step: sample tasks, run episodes through the core agent loop (rollout
log-probs recorded), update, and end the step through the ``on_step_end`` hook: the run's
trackers log its metrics, then the stage's :class:`~.checkpoint.StepCheckpoints` writes a
checkpoint. A run killed at any point resumes (``run.resume=<run folder>``) from its last
complete checkpoint: at most the step in progress is lost.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cuda_agent.core.configcheck import bounds
from cuda_agent.core.errors import ConfigError, InfrastructureError, did_you_mean

from . import checkpoint as ckpt
from .engine import EngineOptions, build_engine, rank, resolve_device, world_size
from .loop import Trainer
from .models import ValueModel, load_causal_lm
from .policy import ActorPolicy, sync_policy_weights
from .rollout import collect, drop_infra_errors, load_trajectories, rollout_metrics, save_trajectories

STAGE_KEYS = ("name", "algorithm", "steps", "agent", "samples_per_task", "critic_init", "environment", "dataset",
              "checkpoint_every")


@dataclass
class StageSpec:
    name: str
    algorithm: dict | str  # {name, options}; a bare name in the config (parse makes it a mapping)
    steps: int = field(default=1, metadata=bounds(min=0))
    agent: dict = field(default_factory=dict)  # AgentOptions overrides: max_turns, context_tokens, ...
    samples_per_task: int | None = field(default=None, metadata=bounds(min=1))  # default: grpo group_size, else 1
    critic_init: str = "previous"  # previous (latest critic of an earlier stage, else the actor) | actor
    environment: dict | None = None
    dataset: dict | None = None
    checkpoint_every: int | None = field(default=None, metadata=bounds(min=0))

    @classmethod
    def parse(cls, raw: dict, index: int) -> "StageSpec":
        if not isinstance(raw, dict):
            raise ConfigError(f"trainer.stages[{index}] must be a mapping, got {raw!r}")
        for k in raw:
            if k not in STAGE_KEYS:
                raise ConfigError(f"unknown key trainer.stages[{index}].{k}; {did_you_mean(k, STAGE_KEYS)}")
        if not raw.get("name") or not raw.get("algorithm"):
            raise ConfigError(f"trainer.stages[{index}] needs a name and an algorithm")
        algo = raw["algorithm"]
        if isinstance(algo, str):
            algo = {"name": algo, "options": {}}
        # keys a stage leaves out take the defaults of the fields above
        spec = cls(name=str(raw["name"]), algorithm=dict(algo), **{k: raw[k] for k in STAGE_KEYS[2:] if k in raw})
        spec.steps, spec.agent = int(spec.steps), dict(spec.agent or {})
        if spec.critic_init not in ("previous", "actor"):
            raise ConfigError(f"trainer.stages[{index}].critic_init must be previous or actor")
        return spec


def _plain(x: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(x, (DictConfig, ListConfig)):
        return OmegaConf.to_container(x, resolve=True)
    return x


def validate(cfg: Any) -> None:
    """Check the trainer section before a run folder is made (one-line ConfigError)."""
    from .engine import resolve_backend

    tc = _plain(cfg.trainer)
    stages = tc.get("stages") or []
    if not stages:
        raise ConfigError("trainer.stages is empty: give at least one stage")
    for i, s in enumerate(stages):
        StageSpec.parse(s, i)
    m = tc.get("model") or {}
    if m.get("path") and not Path(m["path"]).exists():
        raise ConfigError(f"trainer.model.path not found: {m['path']}")
    if not m.get("path") and not m.get("build"):
        raise ConfigError("trainer.model needs a path (a local HF model folder) or build (a tiny random model)")
    if not (tc.get("environment") or {}).get("name"):
        raise ConfigError("trainer.environment needs a name (cuda-agent plugins lists the environments)")
    raw = dict(tc.get("engine") or {})
    names = [f.name for f in dataclasses.fields(EngineOptions)]
    for k in raw:
        if k not in names:
            raise ConfigError(f"unknown key trainer.engine.{k}; {did_you_mean(k, names)}")
    resolve_backend(EngineOptions(**{k: v for k, v in raw.items() if k != "adam_betas"}))


class StageRunner:
    """Runs ``trainer.stages`` of a composed config inside a :class:`~cuda_agent.core.run.Run`."""

    def __init__(self, cfg: Any, run: Any, pm: Any = None, show_progress: bool = True,
                 tasks: Any = None, environment: Any = None):
        self.cfg = cfg
        self.run = run
        self.pm = pm or run.pm
        self.tc: dict = _plain(cfg.trainer)
        self.seed = int(_plain(cfg.run).get("seed", 0) or 0)
        raw_stages = self.tc.get("stages") or []
        if not raw_stages:
            raise ConfigError("trainer.stages is empty: give at least one stage")
        self.stages = [StageSpec.parse(s, i) for i, s in enumerate(raw_stages)]
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ConfigError(f"trainer.stages: stage names must be unique, got {names}")
        self.engine_options = self._engine_options()
        self.trackers = list(getattr(run, "trackers", []))  # the run's: they receive every lifecycle event
        self.show_progress = show_progress
        self.task_sampler = tasks  # optional callable (n, rng) -> list[Task], replaces the dataset
        self.environment = environment  # optional environment factory, replaces trainer.environment
        self.global_step = 0
        self.history: list[dict] = []

    # -- setup -------------------------------------------------------------------------

    def _engine_options(self) -> EngineOptions:
        raw = dict(self.tc.get("engine") or {})
        names = [f.name for f in dataclasses.fields(EngineOptions)]
        for k in raw:
            if k not in names:
                raise ConfigError(f"unknown key trainer.engine.{k}; {did_you_mean(k, names)}")
        if "adam_betas" in raw and raw["adam_betas"] is not None:
            raw["adam_betas"] = tuple(raw["adam_betas"])
        return EngineOptions(**raw)

    def stage_dir(self, index: int) -> Path:
        return Path(self.run.dir) / "stages" / f"{index:02d}-{self.stages[index].name}"

    def base_model_dir(self) -> Path:
        """The starting weights: ``trainer.model.path``, or a tiny model built once into the run folder."""
        m = self.tc.get("model") or {}
        if m.get("path"):
            p = Path(m["path"])
            if not p.exists():
                raise ConfigError(f"trainer.model.path not found: {p}")
            return p
        build = m.get("build")
        if not build:
            raise ConfigError("trainer.model needs a path (a local HF model folder) or build (a tiny random model)")
        out = Path(self.run.dir) / "base_model"
        if not (out / ckpt.MARKER).exists():
            from .tiny import build_tiny_causal_lm

            tok = None
            if m.get("tokenizer") == "environment":
                tok = self._env_factory(None).tokenizer()
                if tok is None:
                    raise ConfigError("trainer.model.tokenizer=environment: the environment has no tokenizer of "
                                      "its own; give a tokenizer folder")
            elif m.get("tokenizer"):
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(m["tokenizer"])
            with ckpt.CheckpointWriter(out) as tmp:
                build_tiny_causal_lm(tmp, tokenizer=tok, seed=self.seed, **dict(build))
        return out

    def _env_factory(self, stage: StageSpec | None) -> Any:
        """The stage's environment plugin (``register_environments``), bound to the run's config."""
        if self.environment is not None:
            return self.environment
        where = "trainer.environment"
        spec = self.tc.get("environment")
        if stage is not None and stage.environment:
            where, spec = f"trainer.stages[{self.stages.index(stage)}].environment", stage.environment
        if not spec or not spec.get("name"):
            raise ConfigError(f"{where} needs a name (cuda-agent plugins lists the environments)")
        factory = self.pm.create("environment", spec, where=where)
        factory.bind(self.cfg, self.pm)
        return factory

    def _tasks(self, stage: StageSpec, factory: Any) -> Any:
        if self.task_sampler is not None:
            return self.task_sampler
        spec = stage.dataset or self.tc.get("dataset")
        if spec and spec.get("name"):
            ds = self.pm.create("dataset", spec, where="trainer.dataset")
            pool = list(ds.tasks())
            if not pool:
                raise ConfigError(f"dataset {spec['name']!r} gave no tasks")
            return lambda n, rng: [rng.choice(pool) for _ in range(n)]
        if getattr(factory, "makes_tasks", hasattr(factory, "tasks")):
            return factory.tasks
        raise ConfigError("trainer.dataset needs a name (the environment does not make its own tasks)")

    def _find_previous(self, index: int, what: str) -> Path | None:
        for j in range(index - 1, -1, -1):
            p = self.stage_dir(j) / "final" / what
            if p.exists():
                return p
        return None

    # -- the run -------------------------------------------------------------------------

    def run_all(self) -> list[dict]:
        base = self.base_model_dir()
        for i, stage in enumerate(self.stages):
            sdir = self.stage_dir(i)
            if ckpt.is_complete(sdir / "final"):
                self.global_step += stage.steps
                self.run.log.info("stage.skip", stage=stage.name, reason="already complete")
                continue
            self.pm.hook.on_stage_start(run=self.run, stage=stage)
            self.run_stage(i, stage, base)
        return self.history

    def run_stage(self, index: int, stage: StageSpec, base: Path) -> None:
        sdir = self.stage_dir(index)
        sdir.mkdir(parents=True, exist_ok=True)
        algo = self.pm.create("algorithm", stage.algorithm, where=f"trainer.stages[{index}].algorithm")
        o = algo.options
        dtype = self.tc["model"]["dtype"]
        actor_init = self._find_previous(index, "actor") or base
        critic_init = actor_init
        if stage.critic_init == "previous":
            critic_init = self._find_previous(index, "critic") or actor_init
        resume = ckpt.latest_checkpoint(sdir)
        start = 0
        if resume is not None:
            start = resume[0] + 1
            actor_init = resume[1] / "actor" if (resume[1] / "actor").exists() else actor_init
            critic_init = resume[1] / "critic" if (resume[1] / "critic").exists() else critic_init
            self.run.log.info("stage.resume", stage=stage.name, from_step=resume[0])
        if getattr(self.run, "resumed", False):
            # steps logged after the last complete checkpoint (one killed while its checkpoint
            # was written, or ones between checkpoints) are redone: their metrics go first
            last_done = self.global_step + (resume[0] if resume is not None else -1)
            for t in self.trackers:
                t.truncate(last_done)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(self.base_model_dir()))
        self.tokenizer = tokenizer
        factory = self._env_factory(stage)
        sample_tasks = self._tasks(stage, factory)
        source = getattr(o, "source", "collect")
        pool: list = []
        if source == "file":  # recorded trajectories, filtered like rollouts
            pool, stats = algo.select(load_trajectories(o.trajectories)) if hasattr(algo, "select") else (
                load_trajectories(o.trajectories), {})
            self.run.log.info("stage.trajectories", stage=stage.name, path=str(o.trajectories), kept=len(pool),
                              **{k.replace("/", "_"): v for k, v in stats.items()})
            if not pool:
                raise ConfigError(f"stage {stage.name}: no trajectory of {o.trajectories} passes the filters")
        elif source == "previous":
            prev = index - 1
            if prev >= 0:
                for f in sorted((self.stage_dir(prev) / "kept").glob("step-*.jsonl")):
                    pool.extend(load_trajectories(f))
            if not pool:
                self.run.log.warning("stage.no_trajectories", stage=stage.name,
                                     note="previous stage kept none; collecting fresh rollouts")
        needs_actor_model = algo.trains_actor or not pool
        max_grad = float(getattr(o, "max_grad_norm", 1.0))
        actor = critic = reference = None
        if needs_actor_model:
            model = load_causal_lm(actor_init, dtype)
            actor = build_engine(model, float(getattr(o, "actor_lr", 0.0) or 0.0), max_grad, self.engine_options)
            if algo.trains_actor and resume is not None:
                actor.load_state(resume[1] / "actor_state")
        if algo.trains_critic:
            cmodel = ValueModel.from_pretrained(critic_init, dtype)
            critic = build_engine(cmodel, float(getattr(o, "critic_lr", 0.0)), max_grad, self.engine_options)
            if resume is not None:
                critic.load_state(resume[1] / "critic_state")
        if algo.needs_reference:
            reference = load_causal_lm(self._find_previous(index, "actor") or base, dtype)
            reference.to(resolve_device(self.engine_options)).eval()
            for p in reference.parameters():
                p.requires_grad_(False)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        trainer = Trainer(actor, critic, reference, pad_id=pad, max_length=self.tc.get("max_length"))
        policy = None
        if actor is not None:
            policy = self._policy(actor, tokenizer, stage, actor_init)
        agent_options = self._agent_options(stage)
        samples = stage.samples_per_task or int(getattr(o, "group_size", 1) or 1)
        checkpoint = self.tc["checkpoint"]
        every = int(stage.checkpoint_every if stage.checkpoint_every is not None else checkpoint["every"])
        saver = ckpt.StepCheckpoints(sdir, index, self.global_step, stage.steps, every,  # every 0: none (benchmarks)
                                     int(checkpoint["keep"]), actor if algo.trains_actor else None,
                                     critic if algo.trains_critic else None, tokenizer, is_main=rank() == 0)
        critic_warmup = int(getattr(o, "critic_warmup_steps", 0) or 0)
        stage_offset = self.global_step
        ws = world_size()
        per_rank = max(1, int(o.batch_size) // ws)
        rollout = self.tc["rollout"]
        saver_name = f"checkpoints-{self.run.id}-{index}"
        self.pm.attach(saver, saver_name)
        try:
            for step in range(start, stage.steps):
                t_step = time.monotonic()
                seed = self.seed * 1_000_003 + index * 10_007 + step * 101 + rank()
                torch.manual_seed(seed)
                rng = random.Random(seed)
                metrics: dict[str, float] = {"stage": float(index)}
                if pool:
                    order = list(range(len(pool)))
                    random.Random(seed).shuffle(order)
                    trajs = [pool[order[k % len(pool)]] for k in range(per_rank)]
                    rollout_s = 0.0
                else:
                    n_tasks = max(1, per_rank // samples)
                    tasks = sample_tasks(n_tasks, rng)
                    res = collect(tasks, policy, lambda t, i: factory.make(t, None), agent_options,
                                  concurrency=int(rollout["concurrency"]), samples_per_task=samples, step=step,
                                  show_progress=self.show_progress, pm=self.pm)
                    for t in res.trajectories:
                        self.pm.hook.on_trajectory_end(run=self.run, trajectory=t)
                    trajs = self._without_infra_errors(res.trajectories, stage, step, metrics)
                    rollout_s = res.seconds
                    metrics["rollout/tokens_per_s"] = res.tokens_per_s
                    metrics["rollout/seconds"] = res.seconds
                    metrics["rollout/generated_tokens"] = float(res.generated_tokens)
                    metrics["rollout/generate_seconds"] = res.generate_seconds
                    metrics["rollout/mean_batch"] = res.mean_batch
                metrics.update(rollout_metrics(trajs))
                in_warmup = step < critic_warmup
                up = trainer.update(trajs, algo, step=step, train_actor=not in_warmup, train_critic=True)
                metrics.update(up)
                if policy is not None and algo.trains_actor:
                    sync_policy_weights(policy, engine=actor)
                metrics["step_seconds"] = time.monotonic() - t_step
                metrics["rollout/share_of_step"] = rollout_s / max(metrics["step_seconds"], 1e-9)
                metrics["stage_step"] = float(step)
                if torch.cuda.is_available():
                    metrics["memory/peak_gb"] = torch.cuda.max_memory_allocated() / 2 ** 30
                gstep = stage_offset + step
                self.history.append({"step": gstep, "stage": stage.name, **metrics})
                if getattr(algo, "name", "") == "rft" and rank() == 0:
                    kept, _ = algo.select(trajs)
                    save_trajectories(kept, sdir / "kept" / f"step-{step:06d}.jsonl")
                # the trackers log the step, then the stage's checkpointing writes it (StepCheckpoints)
                self.pm.hook.on_step_end(run=self.run, step=gstep, metrics=metrics)
        finally:
            self.pm.detach(saver_name)
        self._finish_stage(sdir, stage_offset + stage.steps, factory)
        del trainer, actor, critic, reference, policy, saver
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _finish_stage(self, sdir: Path, global_step: int, factory: Any) -> None:
        # the stage's result: the weights of its last checkpoint (or its untouched inputs)
        final = sdir / "final"
        if rank() == 0:
            last = ckpt.latest_checkpoint(sdir)
            with ckpt.CheckpointWriter(final) as tmp:
                if last is not None:
                    for what in ("actor", "critic"):
                        if (last[1] / what).exists():
                            shutil.copytree(last[1] / what, tmp / what)
        self.global_step = global_step
        if self.environment is None:
            factory.close()

    def _without_infra_errors(self, trajs: list, stage: StageSpec, step: int, metrics: dict) -> list:
        """The step's episodes without those the infrastructure ended (counted in
        ``rollout/infra_errors``); a step left with none stops the run (resumable)."""
        kept, dropped = drop_infra_errors(trajs)
        metrics["rollout/episodes"] = float(len(kept))
        metrics["rollout/infra_errors"] = float(len(dropped))
        if dropped:
            error = str(dropped[-1].metadata.get("error") or "infrastructure error")
            self.run.log.warning("rollout.infra_errors", stage=stage.name, step=step, dropped=len(dropped),
                                 of=len(trajs), error=error)
            if not kept:
                raise InfrastructureError(
                    f"stage {stage.name} step {step}: all {len(trajs)} episodes failed for infrastructure reasons "
                    f"({error}); fix it and resume with run.resume={self.run.dir}")
        return kept

    def _policy(self, actor: Any, tokenizer: Any, stage: StageSpec, actor_init: Path | None = None) -> Any:
        r = self.tc["rollout"]
        agent = {**dict(self.tc.get("agent_defaults") or {}), **stage.agent}
        engine = r["engine"]
        if engine not in ("actor", "policy"):
            raise ConfigError(f"trainer.rollout.engine={engine!r}; valid: actor (batched HF generate on the "
                              "trained weights), policy (the run's token-level policy plugin, e.g. vllm, vllm_server or hf)")
        if engine == "policy":
            policy = self._plugin_policy(actor_init)
            if hasattr(policy, "update_weights"):  # an engine or server may hold other weights: align first
                sync_policy_weights(policy, engine=actor)
            return policy
        gather = None
        if getattr(actor, "zero_stage", 0) == 3:
            import deepspeed

            params = list(actor.module.parameters())
            gather = lambda: deepspeed.zero.GatheredParameters(params)  # noqa: E731
        return ActorPolicy(actor.module, tokenizer, gather=gather, device=actor.device, max_batch=int(r["max_batch"]),
                           temperature=float(r["temperature"]), top_p=float(r["top_p"]),
                           max_new_tokens=int(agent.get("max_tokens_per_turn", r["max_new_tokens"])),
                           seed=self.seed, autocast_dtype={"bf16": torch.bfloat16, "fp16": torch.float16}.get(
                               self.engine_options.mixed_precision))

    def _plugin_policy(self, actor_init: Path | None) -> Any:
        """The run's ``policy:`` plugin as the rollout engine; its weights are synced after each update.

        An empty ``options.model`` is set to the stage's starting weights.
        """
        spec = _plain(self.cfg.get("policy")) or {}
        if not spec.get("name"):
            raise ConfigError("trainer.rollout.engine=policy needs policy.name (a token-level policy: vllm, vllm_server, hf)")
        opts = dict(spec.get("options") or {})
        if "model" in opts and not opts["model"] and actor_init is not None:
            opts["model"] = str(actor_init)
        policy = self.pm.create("policy", {"name": spec["name"], "options": opts}, where="policy")
        if not getattr(policy, "token_level", False):
            raise ConfigError(f"policy {spec['name']!r} is not token-level: training needs token ids and log-probs")
        return policy

    def _agent_options(self, stage: StageSpec) -> Any:
        from cuda_agent.core.agent import AgentOptions

        base = _plain(self.cfg.get("agent")) or {}
        merged = {**base, **dict(self.tc.get("agent_defaults") or {}), **stage.agent}
        names = [f.name for f in dataclasses.fields(AgentOptions)]
        r = self.tc["rollout"]
        merged.setdefault("sampling", {})
        merged["sampling"] = {"temperature": float(r["temperature"]), "top_p": float(r["top_p"]),
                              **dict(merged.get("sampling") or {})}
        for k in merged:
            if k not in names:
                raise ConfigError(f"unknown agent option {k!r} in stage {stage.name}; {did_you_mean(k, names)}")
        merged["check_hooks"] = merged.get("check_hooks", True)
        return AgentOptions(**merged)
