"""A solution folder that stands on its own, and the commands that re-check one.

:func:`export_solution` writes a run's ``best/``: the task (``model.py``), the solution
(``model_new.py``, ``kernels/``), the runtime loader and the build of the kernels
(``.cuda_agent/build/``), with ``.cuda_agent/workspace.json`` naming the backend and compiler.
``import model_new`` works from that folder or from a copy of it; ``cuda-agent verify`` and
``cuda-agent profile`` re-check it with no service running: they build a private workspace
from the folder's files and judge it through a :class:`~.service.WorkspaceService` of their
own (compile, then verification/profiling jobs on a local pool), as the run did.
"""

from __future__ import annotations

import json
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import click

from cuda_agent.core.configreads import command_reads
from cuda_agent.core.errors import ConfigError
from cuda_agent.core.types import Task

from cuda_agent.core.safefs import Tree, UnsafePath, file_refusal

from .workspace import (STATE_DIR, Workspace, agent_refusals, create_workspace, is_agent_path, remove_workspace,
                        snapshot_files)

RULE_FILES = "judge.files"
_RULE_TEXT = f"(rule {RULE_FILES}: the judged files must be regular files of the folder, no link followed)"

README = """# A verified solution of `{task}`

- `model.py`: the task (the reference); `model_new.py` and `kernels/`: the solution;
  `cuda_agent_runtime.py` loads the kernels' build from `.cuda_agent/build/`.
- Use it: `import model_new` from this folder (or a copy of it, `.cuda_agent/` included) with
  torch installed; the build is for the {backend} backend ({compiler}) of the machine that ran it.
  Elsewhere, build it again with `cuda-agent verify <this folder>` first.
- Re-check it (no service needed; the command starts what it needs):

      cuda-agent verify {here}
      cuda-agent profile {here}
"""


def recheck_commands(folder: str | Path) -> list[str]:
    """The commands that re-check the solution in ``folder``."""
    return [f"cuda-agent verify {folder}", f"cuda-agent profile {folder}"]


def export_solution(dest: Path, task: Task, files: dict[str, str], ws: Workspace, build: Any = None) -> str | None:
    """Write the solution ``files`` of ``task`` (in workspace ``ws``'s form) to ``dest`` as a
    folder that stands on its own; ``build(src, build_dir)`` builds its kernels (a
    :class:`..judge.pipeline.Judge`'s ``build``). Returns why the build is missing, or None."""
    dest = Path(dest)
    for rel, text in files.items():
        if not is_agent_path(rel):
            continue
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "model.py").write_text(task.code)
    shutil.copyfile(ws.root / "cuda_agent_runtime.py", dest / "cuda_agent_runtime.py")
    state = dest / STATE_DIR
    state.mkdir(exist_ok=True)
    Workspace(root=dest.resolve(), backend=ws.backend, compiler=ws.compiler, protected=[], task_id=task.id).save()
    (dest / "README.md").write_text(README.format(task=task.id, backend=ws.backend, compiler=ws.compiler,
                                                  here=dest))
    if build is None:
        return "no build step given"
    result = build(dest, state / "build")
    if not result.ok:
        return (result.errors or ["the build failed"])[0]
    return None


# --- re-checking a folder ---------------------------------------------------------------------


def solution_folder(path: Path) -> Path:
    """The folder to re-check: ``path`` itself, or a run folder's ``best/``."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path}: no such folder; give a run folder, its best/ or a workspace")
    if not (path / "model_new.py").is_file() and (path / "best" / "model_new.py").is_file():
        return path / "best"
    return path


def solution_refusals(folder: Path) -> list[str]:
    """Why the folder is not judged as it is: one line per link, file with several names,
    FIFO or device among its judged files (``model.py``, ``model_new.py``, ``kernels/``,
    ``.cuda_agent/workspace.json``), each naming its rule; empty when there is none."""
    tree = Tree(folder, "the solution folder")
    out = [f"{r} {_RULE_TEXT}" for r in agent_refusals(folder)]
    for rel in ("model.py", f"{STATE_DIR}/workspace.json"):
        try:
            st = tree.lstat(rel)
        except UnsafePath as exc:
            out.append(f"{exc} {_RULE_TEXT}")
            continue
        if st is None:
            continue
        if stat.S_ISLNK(st.st_mode):
            try:
                target = tree.readlink(rel)
            except (OSError, UnsafePath):
                target = "?"
            out.append(f"{tree.link_error(rel, target)} {_RULE_TEXT}")
        elif file_refusal(st, rel) is not None:
            out.append(f"{file_refusal(st, rel)} {_RULE_TEXT}")
    return out


def _read_text(tree: Tree, rel: str) -> str:
    try:
        return tree.read_text(rel, 4 << 20)
    except UnsafePath as exc:
        raise ConfigError(f"{exc} {_RULE_TEXT}") from None


def read_solution(folder: Path) -> tuple[Task, dict[str, str], str | None, str | None]:
    """The task, the solution's files and, when the folder names them, its backend and compiler
    (every file read through :class:`~cuda_agent.core.safefs.Tree`: no link followed)."""
    tree = Tree(folder, "the solution folder")
    if tree.lstat("model_new.py") is None:
        raise ConfigError(f"{folder}: no model_new.py; give a run folder, its best/ or a workspace")
    if tree.lstat("model.py") is None:
        raise ConfigError(f"{folder}: no model.py (the task's reference is needed to re-check); copy the task's "
                          "model.py into the folder")
    backend = compiler = None
    meta = f"{STATE_DIR}/workspace.json"
    task_id = folder.resolve().name
    if tree.lstat(meta) is not None:
        try:
            d = json.loads(_read_text(tree, meta))
        except ValueError as exc:
            raise ConfigError(f"{folder / meta}: not valid JSON ({exc}); remove it to re-check with the "
                              "defaults") from None
        backend, compiler = d.get("backend"), d.get("compiler")
        task_id = d.get("task_id") or task_id
    files = snapshot_files(folder)
    task = Task(id=task_id, source="user", code=_read_text(tree, "model.py"), name="model.py")
    return task, files, backend, compiler


def refused_answer(kind: str, refused: list[str]) -> dict:
    """The tool's answer for a folder that is not judged (nothing of it built or run)."""
    from cuda_agent.core.types import CandidateOutcome, CompileResult, FailureCategory, VerifyResult

    from .agent_text import request_answer

    c = CompileResult(ok=False, errors=list(refused[:8]))
    out = CandidateOutcome(compile=c, verify=VerifyResult(ok=False, failure=FailureCategory.COMPILE_ERROR,
                                                          message=f"not built or run: {refused[0]}"))
    return request_answer(kind, {"outcome": out, "reward": None, "reused": []})


# what verify and profile read of the run config (the compiler and backend are the solution's own)
READS = {kind: command_reads(kind, "backend", "executor", "service", "reward") for kind in ("verify", "profile")}


def _executor(cfg: Any, backend: str, pm: Any) -> Any:
    """The config's executor on ``backend``: the GPU pool becomes the CPU pool for a CPU solution
    (it has nothing to run on), ray's backend option follows the run's."""
    node = cfg.get("executor") if hasattr(cfg, "get") else None
    if node is None or node.get("name") is None:
        return None  # the service's local pool for the backend
    from ..executors.configured import executor_spec

    spec = executor_spec(node, "auto", pm)
    if str(cfg.get("backend", "auto")) != "auto" or (backend == "cpu" and spec["name"] == "local"):
        spec = executor_spec(spec, backend, pm)
    return pm.create("executor", spec, where="executor")


def recheck(path: Path, kind: str, cfg: Any) -> dict:
    """Judge the solution at ``path`` (``kind``: verify or profile) in a private workspace;
    returns the tool's answer (``text``, ``ok``, ``result``) and ``folder``, ``backend``."""
    from cuda_agent.core.plugins import get_plugin_manager

    from .environment import detect_backend
    from .service import WorkspaceService

    folder = solution_folder(path)
    refused = solution_refusals(folder)
    if refused:  # links and the like: refused with their rule, as the agent's own verify tool does
        answer = refused_answer(kind, refused)
        answer.update(folder=str(folder), backend=str(cfg.get("backend", "auto")), compiler="not built")
        return answer
    task, files, backend, compiler = read_solution(folder)
    given = str(cfg.get("backend", "auto"))
    if backend is not None and given != "auto" and given != backend:
        raise ConfigError(f"backend={given}, but {folder} is a solution for the {backend} backend "
                          f"(recorded in {STATE_DIR}/workspace.json); remove backend={given}")
    wanted = detect_backend(given if backend is None else backend)
    if backend == "cuda" and detect_backend("auto") != "cuda":
        raise ConfigError(f"{folder} is a solution for the CUDA backend and no GPU is usable here; re-check it "
                          "on a machine with one")
    pm = get_plugin_manager()
    tmp = Path(tempfile.mkdtemp(prefix="cuda-agent-recheck-"))
    executor = None
    try:
        ws = create_workspace(task, tmp / "workspace", backend=wanted, compiler=compiler)
        ws.restore(files)
        executor = _executor(cfg, wanted, pm)
        svc = WorkspaceService(ws, compiler, executor, cfg.get("service"), reward=cfg.get("reward"))
        try:
            answer = svc.handle(kind, fresh=True)
        finally:
            svc.close()
    finally:
        if executor is not None:
            executor.close()
        remove_workspace(tmp)
    answer.update(folder=str(folder), backend=wanted, compiler=compiler or ws.compiler)
    return answer


# --- click commands ---------------------------------------------------------------------------


class CheckFailed(click.ClickException):
    """The solution did not pass: exit status 1, the verdict already printed."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        pass


def _command(cli: Any, kind: str, doc: str) -> None:
    from cuda_agent.core.cli import split_args
    from cuda_agent.core.config import compose

    @cli.command(kind, context_settings={"ignore_unknown_options": True}, help=doc)
    @click.argument("path", type=click.Path(file_okay=False, path_type=Path))
    @click.argument("args", nargs=-1)
    @click.option("--json", "as_json", is_flag=True, help="Print the tool's JSON answer.")
    def cmd(path: Path, args: tuple[str, ...], as_json: bool) -> None:
        files, overrides = split_args(args)
        answer = recheck(path, kind, compose(files, overrides, reads=READS[kind]))
        if as_json:
            click.echo(json.dumps(answer, indent=1, default=str))
        else:
            click.echo(answer["text"])
            click.echo(f"({kind} of {answer['folder']}, {answer['backend']} backend, {answer['compiler']})")
        if not answer["ok"]:
            raise CheckFailed(f"{kind} failed")


def register(cli: Any) -> None:
    _command(cli, "verify", "Build and verify the solution in PATH (a run folder, its best/ or a workspace: "
                            "model.py, model_new.py, kernels/) against its model.py on fresh random inputs, with "
                            "no service running. ARGS are config files and key=value overrides. Exit status 1 "
                            "when it does not pass.")
    _command(cli, "profile", "Build, verify and time the solution in PATH (a run folder, its best/ or a workspace) "
                             "against eager PyTorch and torch.compile, and score it, with no service running. ARGS "
                             "are config files and key=value overrides.")
