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
:meth:`Workspace.restore` move exactly those.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cuda_agent.core.errors import CudaAgentError, TaskError
from cuda_agent.core.types import Task

BACKENDS = ("cuda", "cpu")
DEFAULT_COMPILER = {"cuda": "cpp_extension", "cpu": "gxx"}
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

    def agent_paths(self) -> list[str]:
        out = [f for f in AGENT_FILES if (self.root / f).is_file()]
        for d in AGENT_DIRS:
            base = self.root / d
            if base.is_dir():
                for p in sorted(base.rglob("*")):
                    if p.is_file() and not p.is_symlink() and p.suffix in SNAPSHOT_SUFFIXES:
                        if not self._inside(p):
                            continue
                        out.append(str(p.relative_to(self.root)))
        return out

    def _inside(self, p: Path) -> bool:
        try:
            p.resolve().relative_to(self.root.resolve())
            return True
        except ValueError:
            return False

    def snapshot(self) -> dict[str, str]:
        """``{relative path: text}`` of the agent-written files (model_new.py, kernels/**)."""
        files = {}
        for rel in self.agent_paths():
            p = self.root / rel
            if p.stat().st_size > MAX_SNAPSHOT_FILE:
                continue
            files[rel] = p.read_text(errors="replace")
        return files

    def is_agent_path(self, rel: str) -> bool:
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            return False
        return rel in AGENT_FILES or (parts[0] in AGENT_DIRS and len(parts) > 1)

    def restore(self, files: dict[str, str]) -> None:
        """Make the agent's files exactly ``files`` (others under kernels/ are removed)."""
        for rel in files:
            if not self.is_agent_path(rel):
                raise WorkspaceError(f"restore: {rel!r} is not an agent file (model_new.py or kernels/...)")
        for rel in self.agent_paths():
            if rel not in files and rel not in AGENT_FILES:
                (self.root / rel).unlink()
        for rel, text in files.items():
            p = self.root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if p.is_symlink():
                p.unlink()
            existed = p.exists()
            p.write_text(text)  # an existing file keeps its owner and mode
            if not existed and os.geteuid() == 0 and (self.root / "kernels").is_dir():
                st = (self.root / "kernels").stat()  # new files belong to the agent (the sandbox's uid)
                os.chown(p, st.st_uid, st.st_gid)

    # -- access rules -----------------------------------------------------------------

    def check_path(self, path: str | os.PathLike, write: bool = False) -> str | None:
        """Why the agent may not read/write ``path`` (None when it may)."""
        p = Path(path)
        if not p.is_absolute():
            p = self.root / p
        root = self.root.resolve()
        try:
            rel = p.resolve().relative_to(root)
        except ValueError:
            return f"{path} is outside the workspace {root}"
        rel_s = str(rel)
        if rel_s == ".":
            return None
        first = rel.parts[0]
        if first == STATE_DIR:
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

    for p in [root, *root.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            try:
                p.chmod(0o700)
            except OSError:
                pass
    shutil.rmtree(root, onerror=onerror)
