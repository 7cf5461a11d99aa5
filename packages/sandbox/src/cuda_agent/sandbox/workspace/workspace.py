"""The agent's workspace: a folder like the paper's, made from ``tools/template``.

Layout (``cuda`` backend with the ``cpp_extension`` compiler)::

    model.py               task code (read-only): Model, get_inputs, get_init_inputs
    model_new.py           the agent's ModelNew (starts as a skeleton)
    kernels/               the agent's sources: *.cu + *_binding.cpp (cuda), *.cpp (cpu)
    binding.cpp            fixed binding registry (read-only; cpp_extension only)
    binding_registry.h     REGISTER_BINDING(...) (read-only; cpp_extension only)
    cuda_agent_runtime.py  load_kernels() (read-only)
    tools/                 compile.py, verify.py, profile.py (read-only)
    examples/              a complete worked example of the conventions (read-only)
    SKILL.md               the rules and workflow (read-only)
    .cuda_agent/           service socket, build folder, state (not the agent's)

Only ``model_new.py`` and ``kernels/`` are the agent's; :meth:`Workspace.snapshot` and
:meth:`Workspace.restore` move exactly those, through :class:`~cuda_agent.core.safefs.Tree`
(no symbolic link is followed, so nothing outside the workspace is read or written).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cuda_agent.core.errors import CudaAgentError, TaskError
from cuda_agent.core.safefs import Tree, UnsafePath, file_refusal
from cuda_agent.core.types import Task

from ..compilers import DEFAULT_COMPILER  # each backend's default compiler, named there

BACKENDS = ("cuda", "cpu")
COMPILER_BACKEND = {"cpp_extension": "cuda", "nvcc": "cuda", "gxx": "cpu"}
STATE_DIR = ".cuda_agent"
AGENT_FILES = ("model_new.py",)
AGENT_DIRS = ("kernels",)
TOOL_SCRIPTS = ("compile.py", "verify.py", "profile.py", "_client.py")
SNAPSHOT_SUFFIXES = (".py", ".cu", ".cuh", ".cpp", ".cc", ".cxx", ".h", ".hpp", ".hh", ".inl", ".inc", ".c", ".txt", ".md")
MAX_SNAPSHOT_FILE = 1 << 20


class WorkspaceError(CudaAgentError):
    """A workspace cannot be created, opened or changed as asked."""


def _find_dir(env: str, name: str, marker: str) -> Path:
    val = os.environ.get(env)
    if val:
        p = Path(val)
        if not (p / marker).exists():
            raise WorkspaceError(f"${env}={val} does not contain {marker}")
        return p
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / name
        if (cand / marker).exists():
            return cand
    raise WorkspaceError(
        f"cannot find the repository's {name}/ folder (looked above {here.parent}); set ${env}"
    )


def tools_dir() -> Path:
    """The repository's ``tools/`` folder (the workspace template and tool scripts)."""
    return _find_dir("CUDA_AGENT_TOOLS_DIR", "tools", "template")


def skills_dir() -> Path:
    return _find_dir("CUDA_AGENT_SKILLS_DIR", "skills", "cuda/SKILL.md")


def runtime_source() -> Path:
    return Path(__file__).with_name("runtime_loader.py")


def check_task_code(code: str, where: str = "model.py") -> None:
    """One-line TaskError unless ``code`` is a KernelBench-style program."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        raise TaskError(f"{where}:{exc.lineno}: syntax error: {exc.msg}") from exc
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in names]
    if missing:
        raise TaskError(f"{where}: missing {', '.join(missing)} (KernelBench format needs Model, get_inputs, get_init_inputs)")


def render_skill(backend: str, compiler: str) -> str:
    """SKILL.md for a backend, with the section of the chosen compiler filled in."""
    sdir = skills_dir() / backend
    text = (sdir / "SKILL.md").read_text()
    part = sdir / f"compiler-{compiler}.md"
    section = part.read_text() if part.exists() else ""
    return text.replace("{{COMPILER_SECTION}}", section.strip() + "\n" if section else "")


def _chmod_readonly(path: Path) -> None:
    if path.is_symlink():
        return
    if path.is_dir():
        for p in path.rglob("*"):
            if not p.is_symlink():
                p.chmod(0o555 if p.is_dir() else 0o444)
        path.chmod(0o555)
    elif path.exists():
        path.chmod(0o444)


def is_agent_path(rel: str) -> bool:
    """Whether ``rel`` names one of the agent's files (model_new.py, kernels/...)."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts or "." in parts:
        return False
    return rel in AGENT_FILES or (parts[0] in AGENT_DIRS and len(parts) > 1)


def _agent_entries(tree: Tree) -> list[tuple[str, os.stat_result]]:
    """Every entry of the agent's part of the workspace (links as links, never entered)."""
    out = []
    for name in (*AGENT_FILES, *AGENT_DIRS):
        try:
            st = tree.lstat(name)
        except UnsafePath:
            continue
        if st is None:
            continue
        out.append((name, st))
        if name in AGENT_DIRS and stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(UnsafePath, OSError):
                out.extend(tree.walk(name))
    return out


def agent_paths(root: str | os.PathLike) -> list[str]:
    """The agent's source files: regular files with one name, no link on the way."""
    out = []
    for rel, st in _agent_entries(Tree(root)):
        if file_refusal(st, rel) is not None:
            continue
        if rel in AGENT_FILES or Path(rel).suffix in SNAPSHOT_SUFFIXES:
            out.append(rel)
    return out


def snapshot_files(root: str | os.PathLike) -> dict[str, str]:
    """``{relative path: text}`` of the agent's files, read without following any link."""
    tree = Tree(root)
    files = {}
    for rel in agent_paths(root):
        try:
            data = tree.read_bytes(rel, MAX_SNAPSHOT_FILE + 1)
        except (OSError, UnsafePath):
            continue  # changed since it was listed
        if len(data) <= MAX_SNAPSHOT_FILE:
            files[rel] = data.decode("utf-8", errors="replace")
    return files


def agent_refusals(root: str | os.PathLike) -> list[str]:
    """One line per entry of the agent's files that no tool builds, reads or judges: links
    (named with their target), files with several hard links, FIFOs and devices."""
    tree = Tree(root)
    out = []
    for rel, st in _agent_entries(tree):
        if stat.S_ISDIR(st.st_mode):
            continue
        if stat.S_ISLNK(st.st_mode):
            try:
                target = tree.readlink(rel)
            except (OSError, UnsafePath):
                target = "?"
            out.append(str(tree.link_error(rel, target)))
            continue
        why = file_refusal(st, rel)
        if why is not None:
            out.append(str(why))
    return out


def agent_fingerprint(root: str | os.PathLike) -> tuple:
    """Identity of every entry of the agent's files (inode, change time, size): equal
    before and after an operation only when no entry was replaced, added or written."""
    return tuple((rel, st.st_mode, st.st_ino, st.st_ctime_ns, st.st_size) for rel, st in _agent_entries(Tree(root)))


RECORD_MODE = 0o640  # records of a workspace: its owner's, its group may read, others nothing


def _record_fd(fd: int, workspace_root: str | os.PathLike) -> None:
    os.fchmod(fd, RECORD_MODE)
    if os.geteuid() == 0:
        os.fchown(fd, 0, os.stat(workspace_root).st_gid)


def record_access(path: str | os.PathLike, workspace_root: str | os.PathLike) -> None:
    """Give a record of the workspace (its history, a trajectory, a transcript) the
    workspace's permissions: root's, the group of the workspace folder may read it, no one else."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _record_fd(fd, workspace_root)
    finally:
        os.close(fd)


def append_record(path: str | os.PathLike, data: bytes, workspace_root: str | os.PathLike) -> None:
    """Append ``data`` to a record file (never through a link), with the workspace's permissions."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, RECORD_MODE)
    try:
        _record_fd(fd, workspace_root)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


@dataclass
class Workspace:
    root: Path
    backend: str = "cuda"
    compiler: str = "cpp_extension"
    protected: list[str] = field(default_factory=list)
    task_id: str = ""

    # -- locations -----------------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def build_dir(self) -> Path:
        return self.state_dir / "build"

    @property
    def service_socket(self) -> Path:
        return self.state_dir / "service.sock"

    # -- persistence ----------------------------------------------------------------

    def save(self) -> None:
        d = asdict(self)
        d["root"] = str(self.root)
        (self.state_dir / "workspace.json").write_text(json.dumps(d, indent=1))

    @classmethod
    def open(cls, root: str | Path) -> "Workspace":
        root = Path(root).resolve()
        meta = root / STATE_DIR / "workspace.json"
        if not meta.exists():
            raise WorkspaceError(f"{root} is not a workspace (no {STATE_DIR}/workspace.json)")
        d = json.loads(meta.read_text())
        d["root"] = root
        return cls(**{k: d[k] for k in ("root", "backend", "compiler", "protected", "task_id") if k in d})

    # -- the agent's files ------------------------------------------------------------
    # Read and written as root by the service and the environment: only through the
    # workspace's Tree (cuda_agent.core.safefs), which follows no symbolic link.

    @property
    def tree(self) -> Tree:
        return Tree(self.root)

    def agent_paths(self) -> list[str]:
        return agent_paths(self.root)

    def snapshot(self) -> dict[str, str]:
        """``{relative path: text}`` of the agent-written files (model_new.py, kernels/**)."""
        return snapshot_files(self.root)

    def refusals(self) -> list[str]:
        """Why the agent's files cannot be built or judged as they are (links, hard links...)."""
        return agent_refusals(self.root)

    def fingerprint(self) -> tuple:
        return agent_fingerprint(self.root)

    def is_agent_path(self, rel: str) -> bool:
        return is_agent_path(rel)

    def restore(self, files: dict[str, str]) -> list[str]:
        """Make the agent's files exactly ``files`` (others under kernels/ are removed).

        Nothing is written through a link: a link (or a file) in the way of a path to
        write is removed, the link itself, never what it points to. Returns what was
        removed that way."""
        for rel in files:
            if not is_agent_path(rel):
                raise WorkspaceError(f"restore: {rel!r} is not an agent file (model_new.py or kernels/...)")
        tree = self.tree
        removed = []
        owner = self._agent_owner()
        sources = set(agent_paths(self.root))
        for rel, st in _agent_entries(tree):
            if stat.S_ISLNK(st.st_mode) or (rel in sources and rel not in files and rel not in AGENT_FILES):
                with contextlib.suppress(OSError, UnsafePath):
                    tree.unlink(rel)
                    if stat.S_ISLNK(st.st_mode):
                        removed.append(rel)
        for rel, text in files.items():
            for _ in range(len(Path(rel).parts) + 1):
                try:
                    tree.write_text(rel, text, make_dirs=True, owner=owner)  # an existing file keeps its owner
                    break
                except UnsafePath as exc:
                    if exc.kind not in ("link", "not_folder", "hard_link", "special") or not (
                            exc.where == "kernels" or is_agent_path(exc.where)):
                        raise WorkspaceError(f"restore: {exc}") from None
                    tree.unlink(exc.where)
                    removed.append(exc.where)
            else:
                raise WorkspaceError(f"restore: cannot write {rel}: its path keeps changing")
        return removed

    def _agent_owner(self) -> tuple[int, int] | None:
        """The sandbox user the workspace's layout gave the agent's files (None: none)."""
        from ..isolation.privdrop import workspace_user

        with contextlib.suppress(Exception):
            return workspace_user(self.root)
        return None

    # -- access rules -----------------------------------------------------------------

    def check_path(self, path: str | os.PathLike, write: bool = False) -> str | None:
        """Why the agent may not read/write ``path`` (None when it may)."""
        tree = self.tree
        try:
            parts = tree.parts(path)
            tree.lstat(path)
        except UnsafePath as exc:
            return str(exc)
        rel_s = "/".join(parts)
        if not parts:
            return None
        if parts[0] == STATE_DIR:
            return f"{path}: the {STATE_DIR}/ folder belongs to the tools, not to you"
        if write:
            for prot in self.protected:
                if rel_s == prot or rel_s.startswith(prot.rstrip("/") + "/"):
                    return f"{rel_s} is read-only: you may change model_new.py and kernels/ only"
        return None

    def load_kernels(self):
        """Load this workspace's latest build in the current process (host side)."""
        import importlib.util

        spec = importlib.util.spec_from_file_location("cuda_agent_runtime_host", runtime_source())
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        return mod.load_kernels(str(self.root))


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)


def create_workspace(task: Task, dest: str | Path, backend: str = "cuda", compiler: str | None = None,
                     overwrite: bool = False) -> Workspace:
    """Make a fresh workspace for ``task`` at ``dest`` from the repository's template."""
    if backend not in BACKENDS:
        raise WorkspaceError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    compiler = compiler or DEFAULT_COMPILER[backend]
    if compiler in COMPILER_BACKEND and COMPILER_BACKEND[compiler] != backend:
        raise WorkspaceError(f"compiler {compiler!r} builds for backend {COMPILER_BACKEND[compiler]!r}, not {backend!r}")
    check_task_code(task.code, f"task {task.id}")
    root = Path(dest).resolve()
    if root.exists() and any(root.iterdir()):
        if not overwrite:
            raise WorkspaceError(f"{root} exists and is not empty")
        remove_workspace(root)
    root.mkdir(parents=True, exist_ok=True)

    tdir = tools_dir()
    template = tdir / "template" / compiler
    if not template.is_dir():
        template = tdir / "template" / backend
    if not template.is_dir():
        raise WorkspaceError(f"no workspace template for compiler {compiler!r} in {tdir / 'template'}")
    for item in sorted(template.iterdir()):
        _copy(item, root / item.name)
    (root / "kernels").mkdir(exist_ok=True)
    (root / "model.py").write_text(task.code)
    shutil.copyfile(runtime_source(), root / "cuda_agent_runtime.py")
    (root / "tools").mkdir(exist_ok=True)
    for script in TOOL_SCRIPTS:
        if (tdir / script).exists():
            shutil.copyfile(tdir / script, root / "tools" / script)
    (root / "SKILL.md").write_text(render_skill(backend, compiler))
    for sub in ("build", "tmp"):
        (root / STATE_DIR / sub).mkdir(parents=True, exist_ok=True)

    protected = ["model.py", "cuda_agent_runtime.py", "tools", "SKILL.md"]
    for extra in ("examples", "binding.cpp", "binding_registry.h"):
        if (root / extra).exists():
            protected.append(extra)
    ws = Workspace(root=root, backend=backend, compiler=compiler, protected=protected, task_id=task.id)
    ws.save()
    for rel in protected:
        _chmod_readonly(root / rel)
    return ws


def remove_workspace(root: str | Path) -> None:
    """Delete a workspace, read-only parts included."""
    root = Path(root)
    if not root.exists():
        return

    def onerror(func, path, exc_info):
        try:
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, stat.S_IWUSR | stat.S_IRUSR | stat.S_IXUSR)
        except OSError:
            pass
        func(path)

    tree = Tree(root)
    with contextlib.suppress(OSError, UnsafePath):
        for rel, st in [(".", os.stat(root)), *tree.walk(".")]:
            if stat.S_ISDIR(st.st_mode):  # never through a link
                with contextlib.suppress(OSError, UnsafePath):
                    tree.set_owner(rel, None, None, 0o700)
    shutil.rmtree(root, onerror=onerror)
