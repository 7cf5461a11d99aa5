"""``cuda-agent optimize`` (run the agent on your own model.py) and ``cuda-agent demo``.

The output folder holds:

* ``best/``: the best verified solution (``model_new.py``, ``kernels/``) and the runtime loader;
* ``report.md`` and ``report.json``: speedups, timings, reward, every candidate;
* ``transcript.md``: the whole episode, readable; ``trajectories.jsonl``: the raw record;
* ``workspace/``: the agent's workspace (its build of the best solution included);
* ``config.yaml``, ``plugins.json``, ``log.jsonl``: the run's configuration and log.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

import click

from cuda_agent.core.agent import AgentOptions, TrajectoryStore, render_transcript, run_episode_sync
from cuda_agent.core.agent.transcript import candidate_table
from cuda_agent.core.configreads import command_reads
from cuda_agent.core.errors import ConfigError, InfrastructureError, TaskError
from cuda_agent.core.types import INFRA_ERROR, Candidate, Task, Trajectory, to_jsonable

from .environment import CudaEnvironment, detect_backend, environment_options
from .solution import export_solution, recheck_commands

DEMO_DIR = "data/demo"
# backend -> (task file, recorded episode, task name). The CPU example's speedup over
# torch.compile is algorithmic (a scan replaces a product with a triangular matrix, ~10x), so
# it holds on a busy host; a fused element-wise chain is what inductor fuses as well.
DEMOS = {
    "cpu": ("running_sum.py", "trajectory.json", "running sum written as a triangular matrix product (CPU)"),
    "cuda": ("hardswish_affine.py", "trajectory_cuda.json", "fused hard-swish + affine (CUDA)"),
}

# what an episode on one model reads of the run config; the output folder is --out, or a new
# folder under run.output_dir (run.name, run.seed and run.resume mean nothing to one episode)
EPISODE_KEYS = ("run.output_dir", "backend", "logging", "trackers", "policy", "agent", "environment", "compiler",
                "sandbox", "executor", "service", "reward")
READS = {cmd: command_reads(cmd, *EPISODE_KEYS) for cmd in ("optimize", "demo")}


# --- progress ---------------------------------------------------------------------------


class Progress:
    """One updating status line (turn, the tool running or last run, best speedup so far) on a
    terminal, refreshed every second while a tool runs; one line per tool call otherwise, and
    a "still running" line every ``every`` seconds of a long one (a first profile measures the
    baselines). Turns are numbered as in the report and the transcript (from 0)."""

    def __init__(self, max_turns: int, stream: Any = None, enabled: bool = True, every: float = 15.0):
        self.max_turns = max_turns
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every
        self.t0 = time.monotonic()
        self.turn = 0
        self.tool = "-"
        self.running: tuple[str, str, float] | None = None  # tool, what it does, since
        self.best: float | None = None
        self.candidates = 0
        self.correct = 0
        self._width = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._ticker: threading.Thread | None = None

    def line(self) -> str:
        now = time.monotonic()
        el = int(now - self.t0)
        best = f"{self.best:.2f}x vs compile" if self.best is not None else (
            "correct, not profiled" if self.correct else "none yet")
        if self.running is not None:
            tool, detail, since = self.running
            doing = f"running: {tool}" + (f" `{detail}`" if detail else "") + f" ({int(now - since)} s)"
        else:
            doing = f"last tool: {self.tool}"
        return (f"turn {self.turn} ({self.turn + 1} of {self.max_turns}) | {doing} | verified: {self.correct}/"
                f"{self.candidates} | best: {best} | {el // 60:d}:{el % 60:02d}")

    def __call__(self, event: dict) -> None:
        kind = event.get("type")
        with self._lock:
            if kind == "turn":
                self.turn = event["turn"]
            elif kind == "tool_start":
                self.running = (event.get("tool") or "-", event.get("detail") or "", time.monotonic())
            elif kind == "tool":
                self.tool = event.get("tool") or "-"
                self.running = None
            elif kind == "candidate":
                self.candidates += 1
                self.correct += 1 if event.get("correct") else 0
            if "best" in event:
                self.best = event["best"]
            if not self.enabled:
                return
            if self.tty:
                self._draw()
            elif kind in ("tool", "candidate", "end"):
                self._write(self.line() + "\n")
        if kind == "tool_start":
            self._start_ticker()

    def _draw(self) -> None:
        text = self.line()
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self._write("\r" + text + " " * pad)

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _start_ticker(self) -> None:
        if not self.enabled or self._ticker is not None:
            return
        self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        period = 1.0 if self.tty else self.every
        while not self._wake.wait(period):
            with self._lock:
                if self.running is None:
                    continue
                if self.tty:
                    self._draw()
                elif time.monotonic() - self.running[2] >= period:
                    self._write(self.line().replace("running:", "still running:", 1) + "\n")

    def close(self) -> None:
        self._wake.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
            self._ticker = None
        if self.enabled and self.tty:
            self._write("\n")


# --- reports ------------------------------------------------------------------------------


def _timings(c: Candidate | None) -> dict:
    if c is None or c.outcome.profile is None:
        return {}
    p = c.outcome.profile
    out = {}
    for label in ("candidate", "eager", "compile"):
        t = getattr(p, label)
        if t is not None:
            out[label] = {"median_ms": t.median_ms, "spread": t.spread, "method": t.method}
    return out


def build_report(task: Task, model_path: Path | None, traj: Trajectory, backend: str, policy: str, model: str,
                 out_dir: Path) -> dict:
    best = traj.best
    p = best.outcome.profile if best else None
    return {
        "task": task.id,
        "model_py": str(model_path) if model_path else None,
        "backend": backend,
        "policy": policy,
        "model": model,
        "finish_reason": traj.finish_reason,
        "error": traj.metadata.get("error"),
        "turns": len(traj.turns),
        "seconds": traj.metadata.get("seconds"),
        "verified": best is not None,
        "speedup_vs_eager": p.speedup_vs_eager() if p and p.ok else None,
        "speedup_vs_compile": p.speedup_vs_compile() if p and p.ok else None,
        "timings": _timings(best),
        "unsteady": (p.metadata or {}).get("unsteady") if p is not None and p.ok else None,
        "reward": to_jsonable(traj.reward) if traj.reward else None,
        "best_turn": best.turn if best else None,
        "best_files": sorted(best.files) if best else [],
        "best_build_error": traj.metadata.get("best_build_error"),
        "recheck": recheck_commands(out_dir / "best") if best else [],
        "candidates": [
            {"turn": c.turn, "correct": c.outcome.correct, "failure": c.outcome.failure.value,
             "speedup_vs_compile": c.speedup_vs_compile,
             "speedup_vs_eager": c.outcome.profile.speedup_vs_eager() if c.outcome.profile else None}
            for c in traj.candidates
        ],
        "output_dir": str(out_dir),
        "trajectory_id": traj.id,
    }


SPREAD_NOTE = ("Spread: how far the timed calls of one measurement scatter (interquartile range over the median); "
               "a speedup within the spreads of its two timings is noise.")


def render_report(rep: dict, traj: Trajectory) -> str:
    lines = [f"# cuda-agent optimize: {rep['task']}", ""]
    if rep["finish_reason"] == INFRA_ERROR:
        lines.append(f"**The policy endpoint failed; nothing was scored.** {rep['error']}. The episode says "
                     "nothing about the model; fix the endpoint and run again.")
    elif rep["verified"]:
        se, sc = rep["speedup_vs_eager"], rep["speedup_vs_compile"]
        if sc is not None:
            lines.append(f"**Verified solution: {se:.2f}x faster than eager PyTorch, {sc:.2f}x against torch.compile.**")
        else:
            lines.append("**Verified solution (correct; not profiled).**")
    else:
        lines.append("**No verified solution.** No candidate passed verification; see the transcript.")
    lines += ["", "| | |", "| --- | --- |"]
    rows = [
        ("model.py", rep["model_py"] or rep["task"]),
        ("backend", rep["backend"]),
        ("policy", f"{rep['policy']}" + (f" ({rep['model']})" if rep["model"] else "")),
        ("turns", f"{rep['turns']} (ended: {rep['finish_reason']})"),
        ("time", f"{rep['seconds']:.1f} s" if rep["seconds"] is not None else "-"),
    ]
    for label in ("eager", "compile", "candidate"):
        t = rep["timings"].get(label)
        if t:
            name = {"eager": "eager PyTorch", "compile": "torch.compile", "candidate": "this solution"}[label]
            rows.append((name, f"{t['median_ms']:.4g} ms (spread {t['spread'] * 100:.1f}%, {t['method'] or 'timed'})"))
    if rep["reward"]:
        r = rep["reward"]
        rows.append(("reward", f"{r['value']:g} ({r['reward']})" + (" -- not trusted: unsteady host" if rep.get("unsteady") else "")))
    if rep["verified"]:
        rows.append(("best version", f"turn {rep['best_turn']}: {', '.join(rep['best_files'])}"))
    lines += [f"| {a} | {b} |" for a, b in rows]
    if rep["timings"]:
        lines += ["", SPREAD_NOTE]
    if rep.get("unsteady"):
        lines += ["", f"**{rep['unsteady'][0].upper()}{rep['unsteady'][1:]}.** Run it again on a quieter host "
                      "(or with fewer other jobs) before believing the speedup."]
    if traj.candidates:
        lines += ["", "## Every verified version", "", candidate_table(traj)]
    lines += ["", "## Files", ""]
    if rep["verified"]:
        build = ("and the kernels' build (`.cuda_agent/build/`): `import model_new` there, or in a copy of the "
                 "folder, loads it" if not rep.get("best_build_error") else
                 f"without a build (it failed: {rep['best_build_error']})")
        lines += [f"- `best/`: the best solution on its own: `model.py` (the task), `model_new.py`, `kernels/`, "
                  f"`cuda_agent_runtime.py` {build}. Re-check it with no service running (each command starts "
                  "what it needs):", "", *[f"      {c}" for c in rep["recheck"]], ""]
    lines += [
        "- `workspace/`: the agent's workspace as the run left it; its `tools/` talk to the run's service, which "
        "ended with the run" + (" (re-check with the commands above)." if rep["verified"] else "."),
        "- `transcript.md`: the whole episode; `trajectories.jsonl`: its raw record.",
        "",
    ]
    return "\n".join(lines)


# --- the command's work ------------------------------------------------------------------


def _agent_options(cfg: Any) -> AgentOptions:
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(cfg.agent, resolve=True) if "agent" in cfg else {}
    names = {f.name for f in fields(AgentOptions)}
    return AgentOptions(**{k: v for k, v in (node or {}).items() if k in names})


def read_task(model_path: Path) -> Task:
    if not model_path.is_file():
        raise TaskError(f"{model_path}: no such file")
    from .workspace import check_task_code

    code = model_path.read_text()
    check_task_code(code, str(model_path))
    stem = model_path.stem if model_path.stem != "model" else (model_path.parent.name or "model")
    return Task(id=stem, source="user", code=code, name=model_path.name)


def run_optimize(cfg: Any, task: Task, out_dir: Path, model_path: Path | None = None, progress: bool = True,
                 command: str = "optimize") -> dict:
    """Run one episode on ``task``; write best/, reports and the transcript to ``out_dir``."""
    from cuda_agent.core.plugins import get_plugin_manager
    from cuda_agent.core.run import Run

    pm = get_plugin_manager()
    out_dir = Path(out_dir).resolve()
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(f"output folder {out_dir} is not empty; choose another with --out")
    backend = detect_backend(str(cfg.get("backend", "auto")))
    options = _agent_options(cfg)
    policy = pm.create("policy", cfg.policy, where="policy")
    run = Run(cfg, command=command, pm=pm, dir=out_dir)
    with run:
        env = CudaEnvironment.from_config(task, out_dir / "workspace", cfg, pm,
                                          options=environment_options(cfg, backend=backend),
                                          sandbox=_sandbox_spec(cfg, pm))
        bar = Progress(options.max_turns, enabled=progress)
        best_build = None
        try:
            traj = run_episode_sync(task, policy, env, options, on_event=bar, pm=pm)
            if traj.best is not None:  # built while the service's compile worker is up
                best_build = export_solution(out_dir / "best", task, traj.best.files, env.ws, env.service.jobs.build)
        finally:
            bar.close()
            env.close()
        traj.metadata["backend"] = backend
        if best_build is not None:
            traj.metadata["best_build_error"] = best_build
        if traj.infra_error:
            run.status = INFRA_ERROR
        _write_records(out_dir, env.ws.root, traj)
        policy_name = str(cfg.policy.name)
        model = str(cfg.policy.get("options", {}).get("model", "") or "")
        rep = build_report(task, model_path, traj, backend, policy_name, model, out_dir)
        (out_dir / "report.json").write_text(json.dumps(rep, indent=2, default=str))
        (out_dir / "report.md").write_text(render_report(rep, traj))
        pm.hook.on_trajectory_end(run=run, trajectory=traj)
        run.log.info("optimize.done", task=task.id, verified=rep["verified"], finish=traj.finish_reason,
                     speedup_vs_compile=rep["speedup_vs_compile"], turns=rep["turns"])
    return rep


def _write_records(out_dir: Path, ws_root: Path, traj: Trajectory) -> None:
    """trajectories.jsonl and transcript.md, with the workspace's permissions (they hold its files)."""
    from .workspace import record_access

    TrajectoryStore(out_dir / "trajectories.jsonl").append(traj)
    (out_dir / "transcript.md").write_text(render_transcript(traj))
    for name in ("trajectories.jsonl", "transcript.md"):
        record_access(out_dir / name, ws_root)


def _summary(rep: dict) -> str:
    if rep["verified"] and rep["speedup_vs_compile"] is not None:
        head = (f"verified: {rep['speedup_vs_eager']:.2f}x vs eager, {rep['speedup_vs_compile']:.2f}x vs torch.compile"
                f" (turn {rep['best_turn']}, {rep['turns']} turns, {rep['seconds']:.0f} s)")
    elif rep["verified"]:
        head = "verified: correct (not profiled)"
    elif rep["finish_reason"] == INFRA_ERROR:
        head = f"the policy endpoint failed, nothing was scored ({rep['turns']} turns): {rep['error']}"
    else:
        head = f"no verified solution ({rep['turns']} turns, ended: {rep['finish_reason']})"
    out = Path(rep["output_dir"])
    text = f"{head}\nreport: {out / 'report.md'}"
    if rep["verified"]:
        text += f"\nbest solution: {out / 'best'} (re-check: {rep['recheck'][0]})"
    return text


def check_model_up_front(model_path: Path, cfg: Any) -> None:
    """Run model.py's get_init_inputs, Model and get_inputs once, and one forward pass, before
    an agent works on it: a one-line TaskError naming the step that fails. Task code: it runs
    in a child process that gives up our rights first (:mod:`.modelcheck`)."""
    from .modelcheck import check_model

    backend = detect_backend(str(cfg.get("backend", "auto")))
    check_model(model_path, device="cuda" if backend == "cuda" else "cpu")


def _default_out(cfg: Any, stem: str) -> Path:
    """A new folder under ``run.output_dir`` (``runs`` by default)."""
    return Path(str(cfg.run.output_dir)) / f"{time.strftime('%Y%m%d-%H%M%S')}-optimize-{stem}"


def demo_paths(backend: str = "cpu") -> tuple[Path, Path]:
    """The bundled example and the recorded episode for ``backend``."""
    base = Path(str(resources.files("cuda_agent.sandbox").joinpath(DEMO_DIR)))
    model, recording, _ = DEMOS["cuda" if backend == "cuda" else "cpu"]
    return base / model, base / recording


def _sandbox_spec(cfg: Any, pm: Any) -> Any:
    node = cfg.get("sandbox") if hasattr(cfg, "get") else None
    if node is not None:
        return node
    return {"name": "local"} if "local" in pm.components("sandbox") else None


# --- click commands ---------------------------------------------------------------------------


def register(cli: Any) -> None:
    from cuda_agent.core.cli import split_args
    from cuda_agent.core.config import compose

    @cli.command("optimize", context_settings={"ignore_unknown_options": True})
    @click.argument("model_py", type=click.Path(dir_okay=False, path_type=Path))
    @click.argument("args", nargs=-1)
    @click.option("--policy", default=None, help="Policy plugin: openai, replay, hf, vllm (config: policy.name).")
    @click.option("--model", default=None, help="Model name (openai, vllm) or folder (hf).")
    @click.option("--base-url", default=None, help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1.")
    @click.option("--api-key-env", default=None, help="Environment variable holding the API key.")
    @click.option("--recording", default=None, type=click.Path(dir_okay=False), help="Trajectory to replay (policy replay).")
    @click.option("--backend", default=None, type=click.Choice(["auto", "cuda", "cpu"]), help="Kernel backend.")
    @click.option("--max-turns", default=None, type=int, help="Turn limit (config: agent.max_turns).")
    @click.option("--out", "out", default=None, type=click.Path(file_okay=False, path_type=Path),
                  help="Output folder (default: <run.output_dir, runs>/<time>-optimize-<name>).")
    @click.option("--quiet", is_flag=True, help="No progress line.")
    def optimize_cmd(model_py, args, policy, model, base_url, api_key_env, recording, backend, max_turns, out, quiet):
        """Run the agent on MODEL_PY (KernelBench format: Model, get_inputs, get_init_inputs).

        ARGS are config files and key=value overrides. Leaves the best verified solution,
        report.md and transcript.md in the output folder.
        """
        files, overrides = split_args(args)
        extra = []
        if policy:
            extra.append(f"policy.name={policy}")
        name = policy
        if model:
            extra.append(f"policy.options.model={model}")
        if base_url:
            extra.append(f"policy.options.base_url={base_url}")
        if api_key_env:
            extra.append(f"policy.options.api_key_env={api_key_env}")
        if recording:
            extra.append(f"policy.options.path={Path(recording).resolve()}")
        if backend:
            extra.append(f"backend={backend}")
        if max_turns is not None:
            extra.append(f"agent.max_turns={max_turns}")
        cfg = compose(files, overrides + extra, reads=READS["optimize"])
        name = cfg.policy.get("name")
        if not name:
            raise ConfigError("no policy chosen: pass --policy (openai, replay, hf, vllm)")
        check_model_up_front(model_py, cfg)
        task = read_task(model_py)
        rep = run_optimize(cfg, task, out or _default_out(cfg, task.id), model_path=model_py.resolve(),
                           progress=not quiet)
        if rep["finish_reason"] == INFRA_ERROR:
            raise InfrastructureError(f"the policy endpoint failed: {rep['error']}; nothing was scored "
                                      f"(report: {Path(rep['output_dir']) / 'report.md'})")
        click.echo(_summary(rep))

    @cli.command("demo", context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1)
    @click.option("--backend", default="auto", type=click.Choice(["auto", "cuda", "cpu"]),
                  help="auto: CUDA when a GPU is usable, else the CPU backend.")
    @click.option("--out", "out", default=None, type=click.Path(file_okay=False, path_type=Path),
                  help="Output folder (default: <run.output_dir, runs>/<time>-optimize-demo).")
    @click.option("--quiet", is_flag=True, help="No progress line.")
    def demo_cmd(args, backend, out, quiet):
        """Replay a recorded agent episode on a bundled example, for real: the kernel it
        writes is compiled, verified and profiled here (local sandbox; the CPU backend where
        there is no GPU). ARGS are config files and key=value overrides (backend=cpu is
        --backend cpu)."""
        files, overrides = split_args(args)
        given = str(compose(files, overrides, reads=READS["demo"]).backend)  # a file's or an override's
        if given != "auto" and backend != "auto" and given != backend:
            raise ConfigError(f"--backend {backend} and backend={given} disagree; give one of them")
        backend = detect_backend(given if given != "auto" else backend)
        model_path, recording = demo_paths(backend)
        compiler = json.loads(recording.read_text()).get("compiler")
        defaults = ["policy.name=replay", f"policy.options.path={recording}"]
        if compiler:
            defaults.append(f"compiler.name={compiler}")
        cfg = compose(files, defaults + overrides + [f"backend={backend}"], reads=READS["demo"])
        task = Task(id="demo", source="demo", code=model_path.read_text(),
                    name=DEMOS["cuda" if backend == "cuda" else "cpu"][2])
        rep = run_optimize(cfg, task, out or _default_out(cfg, "demo"), model_path=model_path, progress=not quiet,
                           command="demo")
        click.echo(_summary(rep))

    @cli.command("transcript")
    @click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    @click.option("--index", default=-1, type=int, help="Which record of the file (default: the last).")
    def transcript_cmd(path, index):
        """Print a stored trajectory (a trajectories.jsonl record) as a Markdown transcript."""
        store = TrajectoryStore(path)
        trajs = list(store)
        if not trajs:
            raise ConfigError(f"{path}: no complete trajectory record")
        if not -len(trajs) <= index < len(trajs):
            raise ConfigError(f"{path} holds {len(trajs)} trajectories; --index {index} is out of range")
        click.echo(render_transcript(trajs[index]), nl=False)
