"""``cuda-agent train CONFIG... [key=value ...]``: compose the run and run its stages."""

from __future__ import annotations

import click

from cuda_agent.core.configreads import Reads, check_overrides, command_reads

BASE_KEYS = ("run", "logging", "trackers", "trainer", "agent")
POLICY_KEYS = ("policy",)  # trainer.rollout.engine=policy: the policy plugin samples the rollouts
EPISODE_KEYS = ("backend", "environment", "compiler", "sandbox", "executor", "service", "reward")  # the cuda environment
READS = command_reads("train", *BASE_KEYS, *POLICY_KEYS, *EPISODE_KEYS)  # all that a run can read


def run_reads(cfg) -> Reads:
    """What this run reads: the policy only when it samples the rollouts, the episode's sections
    only on the ``cuda`` environment (the toy environment has no kernels, sandbox or executor)."""
    tc = cfg.trainer
    keys = list(BASE_KEYS)
    if str((tc.get("rollout") or {}).get("engine", "actor")) == "policy":
        keys += POLICY_KEYS
    if str((tc.get("environment") or {}).get("name") or "") == "cuda":
        keys += EPISODE_KEYS
    env = (tc.get("environment") or {}).get("name")
    engine = (tc.get("rollout") or {}).get("engine", "actor")
    return Reads("train", tuple(keys), note=f"trainer.environment.name={env}, trainer.rollout.engine={engine}")


@click.command("train", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
@click.option("--no-progress", is_flag=True, help="No rollout progress bar (the per-step lines stay).")
def train_cmd(args: tuple[str, ...], no_progress: bool) -> None:
    """Train: run the stages of trainer.stages (files and key=value overrides, e.g. configs/toy.yaml).

    Prints one line per step and a first-to-last summary, and writes the reward curve
    (reward.html, reward.png with matplotlib) into the run folder. Resume a killed run with
    run.resume=<run folder>.
    """
    from cuda_agent.core.cli import split_args
    from cuda_agent.core.config import compose
    from cuda_agent.core.run import Run

    from .console import StepPrinter, load_steps, quiet_third_party_bars, summary, write_reward_plot
    from .engine import rank
    from .stages import StageRunner, validate

    files, overrides = split_args(args)
    cfg = compose(files, overrides, reads=READS)
    from cuda_agent.core.config import parse_override

    check_overrides(run_reads(cfg), [parse_override(o) for o in overrides])
    validate(cfg)
    quiet_third_party_bars()
    main = rank() == 0
    with Run(cfg, command="train") as run:
        if main:
            click.echo(f"run folder: {run.dir}")
        runner = StageRunner(cfg, run, show_progress=not no_progress)
        printer = StepPrinter([s.name for s in runner.stages], echo=click.echo, main=main)
        name = f"console-{run.id}"
        run.pm.attach(printer, name)
        try:
            history = runner.run_all()
        finally:
            run.pm.detach(name)
        if not main:
            return
        steps = load_steps(run.dir, history)
        for line in summary(steps):
            click.echo(line)
        plot = write_reward_plot(steps, run.dir, title=f"{cfg.run.name}: {run.dir}")
        if plot is not None:
            click.echo(f"reward curve: {plot}")
        if not history:
            click.echo("nothing to do: every stage was already complete")
