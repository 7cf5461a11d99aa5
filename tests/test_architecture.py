"""The import arrows of docs/architecture.md are the code's.

Reads the table of which distribution may import which and the order of the sandbox's
systems from ``docs/architecture.md`` and checks every import statement of every
distribution's sources (lazy ones inside functions included) against them.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
SANDBOX = REPO / "packages" / "sandbox" / "src" / "cuda_agent" / "sandbox"
SYSTEMS = ["isolation", "compilers", "executors", "judge", "workspace"]  # bottom to top


def distributions() -> dict[str, tuple[Path, str]]:
    """Folder name -> (source root, the top-level module name its code lives under)."""
    out = {}
    for group in ("packages", "plugins"):
        for d in sorted((REPO / group).iterdir()):
            src = d / "src"
            if not (d / "pyproject.toml").exists() or not src.is_dir():
                continue
            if (src / "cuda_agent" / d.name).is_dir():
                out[d.name] = (src / "cuda_agent" / d.name, f"cuda_agent.{d.name}")
            else:
                (top,) = [p for p in src.iterdir() if p.is_dir() and not p.name.endswith(".egg-info")]
                out[d.name] = (top, top.name)
    return out


def allowed_table() -> dict[str, set[str]]:
    text = DOC.read_text()
    start = text.index("| distribution | may import |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        name, deps = (c.strip() for c in line.strip("|").split("|"))
        rows[name] = {d.strip() for d in deps.split(",") if d.strip()}
    return rows


def module_name(path: Path, root: Path, top: str) -> list[str]:
    parts = [*top.split("."), *path.relative_to(root).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def imports(path: Path, me: list[str]) -> list[tuple[int, list[str], list[str]]]:
    """(line, imported module as parts, imported names) of every import in the file."""
    out = []
    package = me if path.name == "__init__.py" else me[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = base + (node.module.split(".") if node.module else [])
            else:
                mod = node.module.split(".")
            out.append((node.lineno, mod, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, a.name.split("."), []) for a in node.names)
    return out


def all_imports():
    dists = distributions()
    owner = {top: name for name, (_root, top) in dists.items()}
    for name, (root, top) in dists.items():
        for path in sorted(root.rglob("*.py")):
            if "_built" in path.parts:
                continue
            me = module_name(path, root, top)
            for line, mod, names in imports(path, me):
                dotted = ".".join(mod)
                target = next((owner[t] for t in sorted(owner, key=len, reverse=True)
                               if dotted == t or dotted.startswith(t + ".")), None)
                yield name, path, line, target, mod, names


def test_the_table_names_every_distribution():
    assert set(allowed_table()) == set(distributions())


def test_imports_between_distributions_are_the_documented_arrows():
    table = allowed_table()
    used: dict[str, set[str]] = defaultdict(set)
    outside = []
    for name, path, line, target, mod, _names in all_imports():
        if target is None or target == name:
            continue
        used[name].add(target)
        if target not in table[name]:
            outside.append(f"{path.relative_to(REPO)}:{line}: {name} imports {'.'.join(mod)} ({target})")
    assert not outside, "imports that docs/architecture.md does not allow:\n" + "\n".join(outside)
    stale = {n: sorted(table[n] - used[n]) for n in table if table[n] - used[n]}
    assert not stale, f"arrows in docs/architecture.md that no code uses (remove them): {stale}"


def test_no_distribution_imports_another_ones_private_parts():
    found = []
    for name, path, line, target, mod, names in all_imports():
        if target is None or target == name:
            continue
        private = [p for p in mod if p.startswith("_") and p != "__init__"] + [n for n in names if n.startswith("_")]
        if private:
            found.append(f"{path.relative_to(REPO)}:{line}: {'.'.join(mod)} {names}")
    assert not found, "private modules or names of another distribution:\n" + "\n".join(found)


def _system(mod: list[str]) -> str | None:
    if mod[:2] == ["cuda_agent", "sandbox"] and len(mod) > 2 and mod[2] in SYSTEMS:
        return mod[2]
    return None


def test_inside_the_sandbox_imports_point_down():
    up = []
    for name, path, line, _target, mod, names in all_imports():
        if name != "sandbox":
            continue
        me = _system(module_name(path, SANDBOX, "cuda_agent.sandbox"))
        if me is None:
            continue
        targets = [mod] + ([mod + [n] for n in names] if mod == ["cuda_agent", "sandbox"] else [])
        for t in targets:
            them = _system(t)
            if them and SYSTEMS.index(them) > SYSTEMS.index(me):
                up.append(f"{path.relative_to(REPO)}:{line}: {me} imports {'.'.join(t)} ({them} is above it)")
    assert not up, "upward imports inside the sandbox package:\n" + "\n".join(up)


def test_every_system_is_in_the_map_and_says_what_it_may_import():
    doc = DOC.read_text()
    folders = sorted(p.name for p in SANDBOX.iterdir() if (p / "__init__.py").exists() and p.name != "data")
    assert folders == sorted(SYSTEMS)
    for s in SYSTEMS:
        assert re.search(rf"^  {s}/ ", doc, re.M), f"docs/architecture.md's sandbox map lacks {s}/"
        assert "May import:" in ast.get_docstring(ast.parse((SANDBOX / s / "__init__.py").read_text())), s


def test_old_module_names_are_not_used_in_the_repository():
    """The old names (cuda_agent.sandbox.MOVED) are for code outside the repository."""
    from cuda_agent.sandbox import MOVED

    old = re.compile(r"\bcuda_agent\.sandbox\.(" + "|".join(re.escape(k) for k in MOVED) + r")\b")
    hits = []
    for group in ("packages", "plugins", "scripts", "docs", "tests"):
        for path in (REPO / group).rglob("*"):
            if path.suffix not in (".py", ".md", ".yaml", ".toml") or path == Path(__file__):
                continue
            if {"_built", "build", "__pycache__"} & set(path.parts) or any(p.endswith(".egg-info") for p in path.parts):
                continue
            if path == SANDBOX / "__init__.py":
                continue
            for n, text in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = old.search(text)
                if m:
                    hits.append(f"{path.relative_to(REPO)}:{n}: {m.group(0)}")
    assert not hits, "old module names:\n" + "\n".join(hits)


@pytest.mark.parametrize("old", ["verify", "jobs", "sandboxes.common", "executors.jobs", "workspace"])
def test_old_module_names_still_import_as_the_same_module(old):
    import importlib

    from cuda_agent.sandbox import moved_to

    new = moved_to(f"cuda_agent.sandbox.{old}")
    mod = importlib.import_module(f"cuda_agent.sandbox.{old}")
    if new is None:  # a package now (workspace): its public names are still there
        assert mod.create_workspace is importlib.import_module("cuda_agent.sandbox.workspace.workspace").create_workspace
    else:
        assert mod is importlib.import_module(new)
