"""Loading solutions to score without an agent, in two forms.

* **workspace form** (ours): a folder with ``model_new.py`` and ``kernels/`` (``*.cu`` +
  ``*_binding.cpp`` for CUDA, ``*.cpp`` for the CPU backend), as an agent leaves it.
* **KernelBench single-file form**: one ``.py`` file defining ``ModelNew`` that builds its
  kernels itself (``torch.utils.cpp_extension.load_inline``), as KernelBench and other
  systems produce them.

A solutions folder maps solutions to tasks by name. Accepted layouts (mixable)::

    <root>/<task>/model_new.py [+ kernels/]       one workspace-form solution
    <root>/<task>/<sample>/model_new.py [...]     several samples of one task
    <root>/<task>.py                              one single-file solution
    <root>/<task>/<anything>.py                   several single-file samples
    <root>/level<L>/<task>.py                     grouped by level
    <root>/level_<L>_problem_<P>_sample_<S>_kernel.py   KernelBench's own run layout

``<task>`` is a task id (``/`` may be written ``__``), a task name, or a KernelBench
file name such as ``19_ReLU`` (matched by level and problem number).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from cuda_agent.core.errors import CudaAgentError
from cuda_agent.core.types import Task

WORKSPACE = "workspace"
KERNELBENCH = "kernelbench"
FORMS = (WORKSPACE, KERNELBENCH)

_KERNEL_SUFFIXES = {".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp"}
_KB_RUN_NAME = re.compile(r"level_?(\d+)_problem_?(\d+)(?:_sample_?(\d+))?", re.I)
_LEVEL_DIR = re.compile(r"^level[_-]?(\d+)$", re.I)
_LEVEL_IN = re.compile(r"(?:^|[/_\-])(?:level|l)[_-]?(\d+)(?=[/_\-]|$)", re.I)
_LEAD_NUM = re.compile(r"^(\d+)(?:_|$)")
_MAX_FILE = 2_000_000


class SolutionError(CudaAgentError):
    """A solution or solutions folder cannot be read."""


@dataclass
class Solution:
    """One candidate solution of one task."""

    key: str  # the name it was found under (task id, name or KernelBench file name)
    form: str  # "workspace" or "kernelbench"
    path: Path  # the folder (workspace form) or the file (single-file form)
    files: dict[str, str] = field(default_factory=dict)  # relative path -> text
    level: int | None = None  # from the layout, when it says
    sample: str = ""

    @property
    def label(self) -> str:
        return f"{self.key}#{self.sample}" if self.sample else self.key


def _read(path: Path) -> str:
    if path.stat().st_size > _MAX_FILE:
        raise SolutionError(f"{path}: file too large for a solution ({path.stat().st_size} bytes)")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SolutionError(f"{path}: not UTF-8 text") from exc


def defines_model_new(text: str) -> bool:
    return re.search(r"^\s*class\s+ModelNew\b", text, re.M) is not None


def load_workspace_solution(folder: Path, key: str, level: int | None = None, sample: str = "") -> Solution:
    """``model_new.py`` and ``kernels/*`` of a folder.

    A lone ``model_new.py`` with no ``kernels/`` that does not use the workspace runtime
    loader is a single-file (KernelBench-form) solution.
    """
    folder = Path(folder)
    main = folder / "model_new.py"
    if not main.is_file():
        raise SolutionError(f"{folder}: no model_new.py")
    files = {"model_new.py": _read(main)}
    kdir = folder / "kernels"
    if kdir.is_dir():
        for p in sorted(kdir.rglob("*")):
            if p.is_file() and p.suffix in _KERNEL_SUFFIXES:
                files[p.relative_to(folder).as_posix()] = _read(p)
    uses_runtime = "cuda_agent_runtime" in files["model_new.py"]
    form = WORKSPACE if (len(files) > 1 or uses_runtime) else KERNELBENCH
    if not defines_model_new(files["model_new.py"]):
        # still a candidate: verification will say it has no ModelNew
        pass
    return Solution(key=key, form=form, path=folder, files=files, level=level, sample=sample)


def load_single_file(path: Path, key: str, level: int | None = None, sample: str = "") -> Solution:
    text = _read(Path(path))
    return Solution(key=key, form=KERNELBENCH, path=Path(path), files={"model_new.py": text}, level=level, sample=sample)


def _is_workspace_dir(p: Path) -> bool:
    return (p / "model_new.py").is_file()


def load_solutions(root: str | Path) -> list[Solution]:
    """Every solution found under ``root`` (see the module doc for layouts)."""
    root = Path(root)
    if not root.exists():
        raise SolutionError(f"solutions folder not found: {root}")
    if root.is_file():
        return [load_single_file(root, root.stem)]
    out: list[Solution] = []
    _scan(root, out, level=None)
    if not out:
        raise SolutionError(
            f"no solutions under {root}: expected <task>/model_new.py folders or <task>.py files defining ModelNew"
        )
    return out


def _scan(folder: Path, out: list[Solution], level: int | None) -> None:
    if _is_workspace_dir(folder):
        # the root itself is one solution's workspace
        out.append(load_workspace_solution(folder, folder.name, level))
        return
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or p.name == "__pycache__":
            continue
        if p.is_dir():
            m = _LEVEL_DIR.match(p.name)
            if m:
                _scan(p, out, int(m.group(1)))
            elif _is_workspace_dir(p):
                out.append(load_workspace_solution(p, p.name, level))
            else:
                _scan_task_dir(p, out, level)
        elif p.suffix == ".py":
            m = _KB_RUN_NAME.search(p.stem)
            if m:
                key = f"level{m.group(1)}/{m.group(2)}"
                out.append(load_single_file(p, key, int(m.group(1)), sample=m.group(3) or ""))
            else:
                text = _read(p)
                if defines_model_new(text):
                    out.append(Solution(p.stem, KERNELBENCH, p, {"model_new.py": text}, level))


def _scan_task_dir(folder: Path, out: list[Solution], level: int | None) -> None:
    """A folder named after a task holding several samples."""
    for p in sorted(folder.iterdir()):
        if p.name.startswith("."):
            continue
        if p.is_dir() and _is_workspace_dir(p):
            out.append(load_workspace_solution(p, folder.name, level, sample=p.name))
        elif p.is_file() and p.suffix == ".py":
            text = _read(p)
            if defines_model_new(text):
                out.append(Solution(folder.name, KERNELBENCH, p, {"model_new.py": text}, level, sample=p.stem))


# --- matching solutions to tasks -----------------------------------------------------


def _norm(s: str) -> str:
    return s.strip().replace("__", "/").lower()


def task_number(task: Task) -> int | None:
    """The problem number of a task (KernelBench: the leading number of its file name)."""
    for key in ("problem_id", "problem", "number"):
        v = task.metadata.get(key) if task.metadata else None
        if isinstance(v, int) or (isinstance(v, str) and v.isdigit()):
            return int(v)
    for s in (task.id.rsplit("/", 1)[-1], task.name):
        m = _LEAD_NUM.match(s or "")
        if m:
            return int(m.group(1))
    m = re.search(r"(?:problem|p)[_-]?(\d+)$", task.id, re.I)
    return int(m.group(1)) if m else None


def _key_level_number(key: str, level: int | None) -> tuple[int | None, int | None]:
    m = _KB_RUN_NAME.search(key)
    if m:
        return int(m.group(1)), int(m.group(2))
    parts = key.replace("__", "/").split("/")
    lv = level
    if lv is None:
        m = _LEVEL_IN.search(key)
        if m:
            lv = int(m.group(1))
    m = _LEAD_NUM.match(parts[-1])
    return lv, (int(m.group(1)) if m else None)


class TaskIndex:
    """Finds the task a solution belongs to."""

    def __init__(self, tasks: Sequence[Task]):
        self.tasks = list(tasks)
        self.by_key: dict[str, Task] = {}
        self.by_num: dict[tuple[int | None, int], list[Task]] = {}
        for t in self.tasks:
            for k in (t.id, t.id.rsplit("/", 1)[-1], t.name):
                if k:
                    self.by_key.setdefault(_norm(k), t)
            n = task_number(t)
            if n is not None:
                self.by_num.setdefault((t.level, n), []).append(t)

    def find(self, sol: Solution) -> Task | None:
        t = self.by_key.get(_norm(sol.key))
        if t is not None and (sol.level is None or t.level in (None, sol.level)):
            return t
        lv, num = _key_level_number(sol.key, sol.level)
        if num is None:
            return t
        hits = self.by_num.get((lv, num), [])
        if len(hits) == 1:
            return hits[0]
        if lv is None:
            levels = {k[0] for k in self.by_num if k[1] == num}
            if len(levels) == 1:
                found = self.by_num[(levels.pop(), num)]
                return found[0] if len(found) == 1 else None
        return t


def match_solutions(tasks: Sequence[Task], solutions: Iterable[Solution]) -> tuple[dict[str, list[Solution]], list[Solution]]:
    """Group solutions by task id; also return those that match no task."""
    index = TaskIndex(tasks)
    by_task: dict[str, list[Solution]] = {}
    unmatched: list[Solution] = []
    for s in solutions:
        t = index.find(s)
        if t is None:
            unmatched.append(s)
        else:
            by_task.setdefault(t.id, []).append(s)
    return by_task, unmatched


def covered_task_ids(tasks: Sequence[Task], root: str | Path) -> list[str]:
    """The ids of ``tasks`` (in their order) that the solutions folder ``root`` has a solution for."""
    by_task, _ = match_solutions(tasks, load_solutions(root))
    return [t.id for t in tasks if by_task.get(t.id)]


# --- writing solutions into a workspace -------------------------------------------------


def install_solution(sol: Solution, workspace: str | Path) -> list[str]:
    """Write the solution's files into a workspace; returns the paths written.

    Existing ``kernels/`` sources of the template are removed first so that only the
    solution's kernels get built.
    """
    ws = Path(workspace)
    kdir = ws / "kernels"
    if sol.form == WORKSPACE and kdir.is_dir():
        for p in kdir.rglob("*"):
            if p.is_file() and p.suffix in _KERNEL_SUFFIXES:
                p.unlink()
    written = []
    for rel, text in sol.files.items():
        dest = ws / rel
        if ".." in Path(rel).parts:
            raise SolutionError(f"{sol.path}: path escapes the workspace: {rel}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
        written.append(rel)
    return written


def solutions_from_texts(items: dict[str, str], form: str = KERNELBENCH) -> list[Solution]:
    """Single-file solutions given as ``{key: text}`` (for scripts and tests)."""
    if form not in FORMS:
        raise SolutionError(f"unknown solution form {form!r}; valid: {', '.join(FORMS)}")
    return [Solution(key=k, form=form, path=Path(k), files={"model_new.py": v}) for k, v in items.items()]
