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

Solutions are attacker input (an RL policy's, or anyone's), read by a process with more
rights than their author. So every entry below the folder given is reached through
:class:`cuda_agent.core.safefs.Tree`: no link is followed, and only regular files with one
name are read. A solution holding a symbolic link, a hard link, a FIFO or a device where a
source or ``model_new.py`` belongs is refused (rule :data:`RULE_FILES`, listed in
:attr:`Solution.refused`): it is scored as not built, and nothing of it is read or run.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterable, Sequence

from cuda_agent.core.errors import CudaAgentError
from cuda_agent.core.safefs import Tree, UnsafePath, file_refusal
from cuda_agent.core.types import CandidateOutcome, CompileResult, FailureCategory, Task, VerifyResult

WORKSPACE = "workspace"
KERNELBENCH = "kernelbench"
FORMS = (WORKSPACE, KERNELBENCH)

_KERNEL_SUFFIXES = {".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp"}
_KB_RUN_NAME = re.compile(r"level_?(\d+)_problem_?(\d+)(?:_sample_?(\d+))?", re.I)
_LEVEL_DIR = re.compile(r"^level[_-]?(\d+)$", re.I)
_LEVEL_IN = re.compile(r"(?:^|[/_\-])(?:level|l)[_-]?(\d+)(?=[/_\-]|$)", re.I)
_LEAD_NUM = re.compile(r"^(\d+)(?:_|$)")
_MAX_FILE = 2_000_000
RULE_FILES = "judge.files"


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
    refused: list[str] = field(default_factory=list)  # why it is not built or run (links and the like)

    @property
    def label(self) -> str:
        return f"{self.key}#{self.sample}" if self.sample else self.key


def refusal(shown: str, why: str) -> str:
    """The refusal of a solution's entry that is not a plain file of its folder."""
    why = why.rstrip(". ")
    return (f"{why} (rule {RULE_FILES}: the judged files must be regular files of the solution's folder); "
            f"replace {shown} with the file itself{' (or the folder)' if '.' not in shown.rsplit('/', 1)[-1] else ''}")


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p and p != ".") or "."


def _why(tree: Tree, rel: str, st: os.stat_result) -> str | None:
    """Why ``rel`` (status ``st``) is not read as a file (named, with a link's target), or None."""
    if stat.S_ISLNK(st.st_mode):
        try:
            target = tree.readlink(rel)
        except (OSError, UnsafePath):
            target = "?"
        return refusal(rel, str(tree.link_error(rel, target)))
    why = file_refusal(st, rel)
    return None if why is None else refusal(rel, str(why))


def _read(tree: Tree, rel: str) -> str:
    """The text of the regular file ``rel`` (never through a link); SolutionError otherwise."""
    where = tree.root / rel
    try:
        data = tree.read_bytes(rel, _MAX_FILE + 1)
    except UnsafePath as exc:
        raise SolutionError(refusal(rel, f"{where}: {exc}")) from None
    except OSError as exc:
        raise SolutionError(f"{where}: cannot read: {exc.strerror or exc}") from None
    if len(data) > _MAX_FILE:
        raise SolutionError(f"{where}: file too large for a solution (more than {_MAX_FILE} bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SolutionError(f"{where}: not UTF-8 text") from exc


def _entries(tree: Tree, rel: str) -> list[tuple[str, os.stat_result]]:
    """The entries of the folder ``rel`` of ``tree``, sorted, with their own status (links as links)."""
    out = []
    with tree.folder(tree.parts(rel) if rel != "." else []) as fd:
        for name in sorted(os.listdir(fd)):
            try:
                out.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
            except OSError:
                continue
    return out


def defines_model_new(text: str) -> bool:
    return re.search(r"^\s*class\s+ModelNew\b", text, re.M) is not None


def load_workspace_solution(folder: Path, key: str, level: int | None = None, sample: str = "") -> Solution:
    """``model_new.py`` and ``kernels/*`` of a folder.

    A lone ``model_new.py`` with no ``kernels/`` that does not use the workspace runtime
    loader is a single-file (KernelBench-form) solution.
    """
    return _load_workspace(Tree(folder, "the solution folder"), ".", key, level, sample)


def _load_workspace(tree: Tree, rel: str, key: str, level: int | None = None, sample: str = "") -> Solution:
    folder = tree.root / rel if rel != "." else tree.root
    files: dict[str, str] = {}
    refused: list[str] = []
    main = _join(rel, "model_new.py")
    try:
        st = tree.lstat(main)
        kst = tree.lstat(_join(rel, "kernels"))
    except UnsafePath as exc:
        return Solution(key, WORKSPACE, folder, {}, level, sample, refused=[refusal(main, str(exc))])
    if st is None:
        raise SolutionError(f"{folder}: no model_new.py")
    why = _why(tree, main, st)
    if why:
        refused.append(why)
    else:
        files["model_new.py"] = _read(tree, main)
    kdir = _join(rel, "kernels")
    if kst is not None and stat.S_ISLNK(kst.st_mode):
        refused.append(_why(tree, kdir, kst) or kdir)
    elif kst is not None and stat.S_ISDIR(kst.st_mode):
        try:
            kentries = list(tree.walk(kdir))
        except UnsafePath as exc:
            kentries = []
            refused.append(refusal(kdir, str(exc)))
        for krel, est in kentries:
            if stat.S_ISDIR(est.st_mode):
                continue
            name = str(PurePosixPath(krel).relative_to(rel)) if rel != "." else krel
            why = _why(tree, krel, est)
            if why:
                refused.append(why)
            elif PurePosixPath(krel).suffix in _KERNEL_SUFFIXES:
                files[name] = _read(tree, krel)
    uses_runtime = "cuda_agent_runtime" in files.get("model_new.py", "")
    has_kernels = any(k != "model_new.py" for k in files)
    form = WORKSPACE if (has_kernels or uses_runtime or (refused and kst is not None)) else KERNELBENCH
    return Solution(key=key, form=form, path=folder, files=files, level=level, sample=sample, refused=refused)


def load_single_file(path: Path, key: str, level: int | None = None, sample: str = "") -> Solution:
    path = Path(path)
    tree = Tree(path.parent, "the solutions folder")
    return _single(tree, path.name, key, level, sample, check=False) or Solution(
        key, KERNELBENCH, path, {}, level, sample)


def _single(tree: Tree, rel: str, key: str, level: int | None, sample: str = "", check: bool = True,
            st: os.stat_result | None = None) -> Solution | None:
    """The single-file solution ``rel`` (refused when it is not a plain file); with ``check``,
    None when it defines no ``ModelNew``."""
    path = tree.root / rel
    st = st if st is not None else tree.lstat(rel)
    why = _why(tree, rel, st) if st is not None else None
    if why:
        return Solution(key, KERNELBENCH, path, {}, level, sample, refused=[why])
    text = _read(tree, rel)
    if check and not defines_model_new(text):
        return None
    return Solution(key=key, form=KERNELBENCH, path=path, files={"model_new.py": text}, level=level, sample=sample)


def _is_workspace_dir(tree: Tree, rel: str) -> bool:
    """Whether the folder ``rel`` holds a ``model_new.py`` entry (a link there counts, to be refused)."""
    try:
        return tree.lstat(_join(rel, "model_new.py")) is not None
    except UnsafePath:
        return True


def load_solutions(root: str | Path) -> list[Solution]:
    """Every solution found under ``root`` (see the module doc for layouts)."""
    root = Path(root)
    if not root.exists() and not root.is_symlink():
        raise SolutionError(f"solutions folder not found: {root}")
    if not root.is_dir() or root.is_symlink():
        return [load_single_file(root, root.stem)]
    out: list[Solution] = []
    _scan(Tree(root, "the solutions folder"), ".", out, level=None)
    if not out:
        raise SolutionError(
            f"no solutions under {root}: expected <task>/model_new.py folders or <task>.py files defining ModelNew"
        )
    return out


def _scan(tree: Tree, rel: str, out: list[Solution], level: int | None) -> None:
    if _is_workspace_dir(tree, rel):
        # the root itself is one solution's workspace
        name = tree.root.name if rel == "." else PurePosixPath(rel).name
        out.append(_load_workspace(tree, rel, name, level))
        return
    for name, st in _entries(tree, rel):
        if name.startswith(".") or name == "__pycache__":
            continue
        here = _join(rel, name)
        if stat.S_ISLNK(st.st_mode):  # a folder or a file: refused either way, never entered or read
            key = name[:-3] if name.endswith(".py") else name
            form = KERNELBENCH if name.endswith(".py") else WORKSPACE
            out.append(Solution(key, form, tree.root / here, {}, level, refused=[_why(tree, here, st) or here]))
        elif stat.S_ISDIR(st.st_mode):
            m = _LEVEL_DIR.match(name)
            if m:
                _scan(tree, here, out, int(m.group(1)))
            elif _is_workspace_dir(tree, here):
                out.append(_load_workspace(tree, here, name, level))
            else:
                _scan_task_dir(tree, here, out, level)
        elif name.endswith(".py"):
            stem = name[:-3]
            m = _KB_RUN_NAME.search(stem)
            if m:
                key = f"level{m.group(1)}/{m.group(2)}"
                sol = _single(tree, here, key, int(m.group(1)), sample=m.group(3) or "", check=False, st=st)
            else:
                sol = _single(tree, here, stem, level, st=st)
            if sol is not None:
                out.append(sol)


def _scan_task_dir(tree: Tree, rel: str, out: list[Solution], level: int | None) -> None:
    """A folder named after a task holding several samples."""
    task = PurePosixPath(rel).name
    for name, st in _entries(tree, rel):
        if name.startswith("."):
            continue
        here = _join(rel, name)
        if stat.S_ISLNK(st.st_mode):
            form = KERNELBENCH if name.endswith(".py") else WORKSPACE
            sample = name[:-3] if name.endswith(".py") else name
            out.append(Solution(task, form, tree.root / here, {}, level, sample=sample,
                                refused=[_why(tree, here, st) or here]))
        elif stat.S_ISDIR(st.st_mode) and _is_workspace_dir(tree, here):
            out.append(_load_workspace(tree, here, task, level, sample=name))
        elif name.endswith(".py") and not stat.S_ISDIR(st.st_mode):
            sol = _single(tree, here, task, level, sample=name[:-3], st=st)
            if sol is not None:
                out.append(sol)


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
    solution's kernels get built. Nothing is written through a link."""
    tree = Tree(workspace)
    if sol.form == WORKSPACE:
        try:
            entries = list(tree.walk("kernels"))
        except UnsafePath:
            entries = []
        for rel, st in entries:
            if not stat.S_ISDIR(st.st_mode) and PurePosixPath(rel).suffix in _KERNEL_SUFFIXES:
                tree.unlink(rel)
    written = []
    for rel, text in sol.files.items():
        if ".." in PurePosixPath(rel).parts or rel.startswith("/"):
            raise SolutionError(f"{sol.path}: path escapes the workspace: {rel}")
        try:
            tree.write_text(rel, text, make_dirs=True)
        except UnsafePath as exc:
            raise SolutionError(f"{sol.path}: cannot install {rel}: {exc}") from None
        written.append(rel)
    return written


def refused_outcome(refused: list[str]):
    """The outcome of a refused solution: not built, verification failed saying why."""
    c = CompileResult(ok=False, errors=list(refused[:8]))
    return CandidateOutcome(compile=c, verify=VerifyResult(ok=False, failure=FailureCategory.COMPILE_ERROR,
                                                           message=f"not built or run: {refused[0]}"))


def solutions_from_texts(items: dict[str, str], form: str = KERNELBENCH) -> list[Solution]:
    """Single-file solutions given as ``{key: text}`` (for scripts and tests)."""
    if form not in FORMS:
        raise SolutionError(f"unknown solution form {form!r}; valid: {', '.join(FORMS)}")
    return [Solution(key=k, form=form, path=Path(k), files={"model_new.py": v}) for k, v in items.items()]
