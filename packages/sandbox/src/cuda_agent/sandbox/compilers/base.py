"""The incremental, content-addressed build shared by every compiler plugin.

A build turns the workspace's sources into object files (one per unit) and links them
into one shared library. It reads a private copy of the sources (:mod:`.frozen`: no link
followed; a link, a hard link or a FIFO among them refuses the build, rule ``build.files``);
every tool runs in the build jail (:mod:`.jail`), and every unit's object is kept only when
what the compiler and the assembler really read lies in the copy or the toolchain
(:mod:`.source_check`, rule ``build.reads``):

1. every unit gets a key: hash of compiler name, tool versions, flags, arch, the unit's
   text and the text of every header in the workspace;
2. units whose object is in the cache are not compiled (so an edit to one ``.cu``
   compiles that unit only); the others compile in parallel within the machine's job slots;
3. the link is keyed by the object keys: an unchanged workspace costs hashing only;
4. the library is copied to ``<ws>/.cuda_agent/build/<name>-<linkkey>.so`` (a new name
   per content, so a process can load a new build next to an old one) and
   ``manifest.json`` names it for ``load_kernels()``.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from cuda_agent.core.errors import CudaAgentError
from cuda_agent.core.interfaces import Compiler
from cuda_agent.core.types import CompileResult

from .buildcache import BuildCache, JobSlots, ToolLimits, atomic_copy, atomic_write, run_tool, sha256
from .diagnostics import log_tail, trim_errors
from .frozen import frozen_sources
from .jail import ToolView, claim, why_not_jailed
from .signatures import SignatureError, extern_c_functions
from .source_check import (allowed_roots, ccbin_flags, compiler_search_dirs, link_refusal, nvcc_host_compiler,
                           outside_reads, read_depfiles,
                           read_refusals)

_init_lock = threading.Lock()
# part of every cache key: objects built before builds ran in the jail with their reads
# checked are never reused
BUILD_RULES = "jail+reads-1"
HEADER_SUFFIXES = (".h", ".hpp", ".cuh", ".hh", ".inc", ".inl")
MANIFEST = "manifest.json"


class BuildError(CudaAgentError):
    """The toolchain is missing or misconfigured (not an error in the agent's code)."""


@dataclass
class Unit:
    src: str  # path relative to the workspace root
    argv_fn: object = None  # callable(out_obj: str) -> list[str]
    key: str = ""
    tool: str = "cxx"  # "cxx" (gcc's options) or "nvcc": how the unit reports what it read


@dataclass
class CommonOptions:
    cache_dir: str = ""  # default: $CUDA_AGENT_BUILD_CACHE or ~/.cache/cuda-agent/build
    jobs: int = 0  # compiler processes at once on this machine; 0 = all cores
    max_errors: int = 5
    unit_timeout_s: float = 300.0
    cpu_s: int = 900
    memory_mb: int = 0
    file_size_mb: int = 2048
    extra_flags: list[str] = field(default_factory=list)
    cache_max_gb: float = 20.0  # least recently used objects/libraries beyond this are deleted; 0 = never


def build_dir_of(workspace: Path) -> Path:
    return Path(workspace) / ".cuda_agent" / "build"


def read_manifest(build_dir: Path) -> dict | None:
    try:
        return json.loads((Path(build_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


class IncrementalCompiler(Compiler):
    """Base of the cpp_extension, nvcc and gxx compilers."""

    artifact_kind: ClassVar[str] = "ctypes"  # or "torch_extension"
    artifact_stem: ClassVar[str] = "kernels"
    exports_c_functions: ClassVar[bool] = True

    def __init__(self, options=None):
        super().__init__(options)
        self._cache: BuildCache | None = None
        self._slots: JobSlots | None = None
        self._tls = threading.local()  # per-build state (builds of several workspaces may share this object)

    @property
    def used_libraries(self) -> list[str]:
        """cuBLAS/cuDNN when the sources of the build in progress (this thread) include them."""
        return getattr(self._tls, "libs", [])

    # -- to implement --------------------------------------------------------------

    @abc.abstractmethod
    def units(self, root: Path) -> list[Unit]:
        """The compile units of the workspace, with their command lines."""

    @abc.abstractmethod
    def link_argv(self, objects: list[str], out: str) -> list[str]: ...

    @abc.abstractmethod
    def toolchain_id(self) -> str:
        """Versions, flags and arch: everything besides sources that decides the output."""

    def prepare(self, root: Path) -> None:
        """Build shared inputs (e.g. a precompiled header) before the units."""

    def no_sources_message(self) -> str:
        return "kernels/ holds no source file to build"

    def layout_errors(self, root: Path) -> list[str]:
        """Files this compiler would silently ignore, as errors the agent can act on."""
        return []

    # -- machinery -----------------------------------------------------------------

    @property
    def cache(self) -> BuildCache:
        with _init_lock:
            if self._cache is None:
                cache = BuildCache(self.options.cache_dir or None)
                self._slots = JobSlots(cache.root / "slots", self.options.jobs or None)
                self._cache = cache
        return self._cache

    @property
    def slots(self) -> JobSlots:
        self.cache  # noqa: B018
        return self._slots  # type: ignore[return-value]

    def limits(self) -> ToolLimits:
        o = self.options
        return ToolLimits(timeout_s=o.unit_timeout_s, cpu_s=o.cpu_s, memory_mb=o.memory_mb,
                          file_size_mb=o.file_size_mb)

    # -- what the tools may see and read ---------------------------------------------------

    def compilers(self) -> list[str]:
        """The compiler executables of this plugin (their installations are shown to the tools)."""
        from .toolchain import find_cxx

        return [find_cxx(getattr(self.options, "cxx", ""))]

    def extra_dirs(self) -> list[str]:
        """Absolute folders named by ``-I``/``-isystem``/``-L`` options of the configuration."""
        out, flags = [], list(self.options.extra_flags)
        for i, f in enumerate(flags):
            for opt in ("-I", "-isystem", "-L", "-idirafter", "-iquote"):
                if f == opt and i + 1 < len(flags):
                    out.append(flags[i + 1])
                elif f.startswith(opt) and len(f) > len(opt) and f[len(opt)] in "/":
                    out.append(f[len(opt):])
        return [d for d in out if os.path.isabs(d)]

    def toolchain_paths(self) -> list[str]:
        """Folders the tools read besides ``/usr`` and the system libraries (shown read-only)."""
        out = []
        for exe in self.compilers():
            real = os.path.realpath(exe)
            out += [os.path.dirname(os.path.dirname(real)), os.path.dirname(os.path.abspath(exe))]
        return out + self.extra_dirs()

    def header_roots(self) -> list[str]:
        """Folders whose files a compile may read besides its own sources: the compilers'
        default search lists and the configured include folders (subclasses add theirs)."""
        out: list[str] = []
        for exe in self.compilers():
            out += list(compiler_search_dirs(exe, "c++"))
            if os.path.basename(exe).startswith("nvcc"):  # the host compiler nvcc itself runs
                host = nvcc_host_compiler(exe, ccbin_flags(list(self.options.extra_flags)))
                out += list(compiler_search_dirs(host, "c++")) if host else []
        return out + self.extra_dirs()

    def dep_flags(self, unit: Unit, deps: str, asm_deps: str) -> list[str]:
        """Options making ``unit``'s compile write what it read: the preprocessor's list to
        ``deps``, the assembler's (``.include``, ``.incbin``) to ``asm_deps``."""
        if unit.tool == "nvcc":
            return ["-MD", "-MF", deps, "-Xcompiler", f"-Xassembler,--MD,-Xassembler,{asm_deps}"]
        return ["-MD", "-MF", deps, f"-Wa,--MD,{asm_deps}"]

    def view(self, src: Path, out: Path, inputs: list[str] = ()) -> ToolView:
        return ToolView(sources=str(src), output=str(out), readable=[*self.toolchain_paths(), *inputs])

    def header_text(self, root: Path) -> str:
        parts = []
        for base in (root, root / "kernels"):
            if not base.is_dir():
                continue
            for p in sorted(base.rglob("*") if base.name == "kernels" else base.glob("*")):
                if p.is_file() and p.suffix in HEADER_SUFFIXES:
                    parts.append(f"{p.relative_to(root)}\n{p.read_text(errors='replace')}")
        return "\n".join(parts)

    def _fail(self, t0: float, errors: list[str], log: str, build_dir: Path, rebuilt=None) -> CompileResult:
        atomic_write(build_dir / MANIFEST, json.dumps({"ok": False, "errors": errors}, indent=1))
        return CompileResult(ok=False, errors=errors, log=log_tail(log), seconds=time.monotonic() - t0,
                             rebuilt_units=list(rebuilt or []))

    def build(self, workspace: Path, build_dir: Path | None = None) -> CompileResult:
        t0 = time.monotonic()
        root = Path(workspace).resolve()
        build_dir = Path(build_dir) if build_dir else build_dir_of(root)
        build_dir.mkdir(parents=True, exist_ok=True)
        refused: list = []
        with self.cache.run_dir("build-") as run, frozen_sources(root, parent=run, refused=refused) as src:
            if refused:
                errors = [link_refusal(rel, why) for rel, why in refused]
                return self._fail(t0, errors[: self.options.max_errors], "\n".join(errors), build_dir)
            result = self._build(src, build_dir, t0)
        a, b = str(src), str(root)
        return dataclasses.replace(result, errors=[e.replace(a, b) for e in result.errors],
                                   log=(result.log or "").replace(a, b))

    def _build(self, root: Path, build_dir: Path, t0: float) -> CompileResult:
        """The build of ``root`` (the private copy of the sources)."""
        bad = self.layout_errors(root)
        if bad:
            return self._fail(t0, bad[: self.options.max_errors], "\n".join(bad), build_dir)
        units = self.units(root)
        if not units:
            return self._fail(t0, [self.no_sources_message()], "", build_dir)

        # exported C functions (for the ctypes loader)
        functions: dict[str, dict] = {}
        if self.exports_c_functions:
            try:
                for u in units:
                    text = (root / u.src).read_text(errors="replace")
                    for name, sig in extern_c_functions(text, u.src).items():
                        functions[name] = sig
            except SignatureError as exc:
                return self._fail(t0, [str(exc)], str(exc), build_dir)
            if not functions:
                msg = 'no extern "C" function found in kernels/: export your launchers with extern "C"'
                return self._fail(t0, [msg], msg, build_dir)

        from .toolchain import used_cuda_libraries

        self._tls.libs = used_cuda_libraries(
            [(root / u.src).read_text(errors="replace") for u in units] + [self.header_text(root)])
        tool_id = self.toolchain_id()
        headers = self.header_text(root)
        for u in units:
            src_text = (root / u.src).read_bytes()
            u.key = sha256(self.name, BUILD_RULES, tool_id, u.src, src_text, headers)
        link_key = sha256(self.name, BUILD_RULES, tool_id, "link", " ".join(self.used_libraries),
                          *sorted(u.key for u in units))
        artifact = f"{self.artifact_stem}-{link_key[:16]}.so"

        man = read_manifest(build_dir)
        if man and man.get("ok") and man.get("link_key") == link_key and (build_dir / artifact).exists():
            return CompileResult(ok=True, artifact=str(build_dir / artifact), cached=True,
                                 seconds=time.monotonic() - t0, log="up to date")

        cache = self.cache
        todo = [u for u in units if not cache.object_path(u.key).exists()]
        for u in units:
            if u not in todo:
                cache.touch(cache.object_path(u.key))
        logs: list[str] = []
        failed: list[str] = []
        if todo:
            try:
                self.prepare(root)
            except BuildError:
                raise
            with ThreadPoolExecutor(max_workers=min(len(todo), self.slots.n)) as pool:
                runs = list(pool.map(lambda u: self._compile_unit(root, u), todo))
            for u, (ok, out) in zip(todo, runs):
                if out.strip():
                    logs.append(out)
                if not ok:
                    failed.append(u.src)
        rebuilt = [u.src for u in todo]
        log = "\n".join(logs)
        if failed:
            errors = trim_errors(log, root, self.options.max_errors)
            return self._fail(t0, errors, log, build_dir, rebuilt)

        lib = cache.lib_path(link_key)
        if not lib.exists():
            objects = [str(cache.object_path(u.key)) for u in units]
            with cache.run_dir("link-") as run:
                out = run / "out"
                tmp = out / f"{self.artifact_stem}.so"
                argv = self.link_argv(objects, str(tmp))
                res = run_tool(argv, root, self.limits(), slots=self.slots, view=self.view(root, out, objects))
                if res.exit_code != 0 or not claim(tmp):
                    errors = trim_errors(res.output, root, self.options.max_errors)
                    return self._fail(t0, errors or ["link: no library was written"], log + "\n" + res.output,
                                      build_dir, rebuilt)
                if res.output.strip():
                    log += "\n" + res.output
                lib.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, lib)
        cache.touch(lib)
        atomic_copy(lib, build_dir / artifact)
        for old in build_dir.glob(f"{self.artifact_stem}-*.so"):
            if old.name != artifact:
                with contextlib.suppress(OSError):
                    old.unlink()
        manifest = {
            "ok": True,
            "kind": self.artifact_kind,
            "artifact": artifact,
            "module": getattr(self, "module_name", ""),
            "backend": self.backend,
            "compiler": self.name,
            "link_key": link_key,
            "units": {u.src: u.key for u in units},
            "functions": functions,
            "built_at": time.time(),
            "jail": why_not_jailed() or "yes",
        }
        atomic_write(build_dir / MANIFEST, json.dumps(manifest, indent=1))
        self._maybe_prune()
        return CompileResult(ok=True, artifact=str(build_dir / artifact), log=log_tail(log),
                             seconds=time.monotonic() - t0, cached=not todo, rebuilt_units=rebuilt)

    def _maybe_prune(self) -> None:
        """Every 100 linking builds of this compiler object, trim the cache to its budget."""
        self._builds = getattr(self, "_builds", 0) + 1
        if self.options.cache_max_gb > 0 and self._builds % 100 == 1:
            with contextlib.suppress(OSError):
                with self.cache.lock("prune"):
                    self.cache.prune(int(self.options.cache_max_gb * (1 << 30)))

    def unit_inputs(self, unit: Unit) -> list[str]:
        """Files or folders outside the sources a unit's compile reads (a precompiled header)."""
        return []

    def _compile_unit(self, root: Path, unit: Unit) -> tuple[bool, str]:
        """Compile one unit in the jail; keep its object only when it read nothing it may not."""
        cache = self.cache
        with cache.run_dir("unit-") as run:
            out = run / "out"
            obj, deps, asm_deps = out / "unit.o", out / "unit.d", out / "unit.as.d"
            argv = [*unit.argv_fn(str(obj)), *self.dep_flags(unit, str(deps), str(asm_deps))]  # type: ignore[operator]
            inputs = self.unit_inputs(unit)
            res = run_tool(argv, root, self.limits(), slots=self.slots, view=self.view(root, out, inputs))
            tmp = "/tmp" if not res.jailed else str(run / "tmp")
            read, missing = read_depfiles([deps, asm_deps])
            roots = allowed_roots([str(root), tmp, *self.header_roots(), *inputs])
            bad = outside_reads(read, str(root), roots)
            if bad:
                return False, "\n".join(read_refusals(unit.src, bad))
            if res.exit_code == 0 and missing:
                return False, (f"{unit.src}:1: error: the compiler did not say what it read ({', '.join(missing)} "
                               f"missing), so its object is not used (rule build.reads)")
            if res.exit_code == 0 and claim(obj) and obj.stat().st_size > 0:
                dst = cache.object_path(unit.key)
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(obj, dst)
                return True, res.output
            return False, res.output or f"{unit.src}: error: compiler exited with {res.exit_code}"


def agent_sources(root: Path, suffixes: tuple[str, ...], exclude_suffix: str | None = None,
                  only_suffix: str | None = None) -> list[str]:
    """Relative paths of ``kernels/**`` files with these suffixes."""
    kdir = root / "kernels"
    if not kdir.is_dir():
        return []
    out = []
    for p in sorted(kdir.rglob("*")):
        if not p.is_file() or p.suffix not in suffixes:
            continue
        name = p.name
        if exclude_suffix and name.endswith(exclude_suffix):
            continue
        if only_suffix and not name.endswith(only_suffix):
            continue
        out.append(str(p.relative_to(root)))
    return out
