"""What a built extension asks of the process that loads it: its dynamic symbols.

C++ in a candidate's extension can run Python past every check on the Python side: call
``PyRun_SimpleString``, import modules with ``PyImport_ImportModule`` and reach any attribute
with ``PyObject_GetAttrString``, directly or through ``dlsym``/``dlopen``. The loader has to
resolve every function a shared object calls by name, so the object's undefined dynamic
symbols say what it calls outside itself, whatever its source spelled. This module reads
them from the ELF file (no tool needed) and judges them against what an honest binding
needs (rule ``native.python-api``):

* ``ctypes`` kernel libraries (``gxx``, ``nvcc``): no Python C API at all;
* torch extensions (``cpp_extension``, ``load_inline``): the Python C API that pybind11 and
  torch's type casters instantiate for a module of bound functions (:data:`BINDING_PYTHON_API`,
  measured on real builds of honest bindings by ``scripts/native_symbols_measure.py``, and
  the families of it that handle the objects a binding is handed, :data:`BINDING_FAMILIES`),
  never what runs or compiles code (``PyRun_*``, ``Py_CompileString*``, ``PyEval_Eval*``),
  imports (``PyImport_*``), or reads the interpreter's globals, frames or ``sys``
  (:data:`REFUSED_PYTHON_API`). pybind11 itself takes the interpreter's lock with
  ``PyGILState_Ensure`` and reads attributes with ``PyObject_GetAttrString``, so those pass
  here; the sources may not name them (:mod:`.native_sources`);
* neither may look symbols up or load libraries at run time (``dlsym``, ``dlopen``,
  ``dlvsym``, ``dlmopen``, ``dl_iterate_phdr``), nor link ``libpython`` itself.

The check runs in the trusted process, on the files the job copied, before the candidate
process loads them; a refusal names the symbol and says what to change.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

RULE = "native.python-api"

# Python C API symbols an honest pybind11 / torch extension module imports (measured on
# torch.utils.cpp_extension.load_inline and the cpp_extension compiler's builds of honest
# bindings with tensor checks, torch 2.x, pybind11 2.x; see scripts/native_symbols_measure.py)
BINDING_PYTHON_API = frozenset({
    "PyBaseObject_Type", "PyByteArray_AsString", "PyByteArray_Size", "PyByteArray_Type", "PyBytes_AsString",
    "PyBytes_AsStringAndSize", "PyBytes_Size", "PyCFunction_Type", "PyCMethod_New", "PyCapsule_GetContext",
    "PyCapsule_GetName", "PyCapsule_GetPointer", "PyCapsule_New", "PyCapsule_SetContext",
    "PyCapsule_SetDestructor", "PyDict_Contains", "PyDict_GetItemWithError", "PyDict_New", "PyDict_SetDefault",
    "PyDict_Type", "PyErr_Clear", "PyErr_Fetch", "PyErr_Format", "PyErr_NormalizeException", "PyErr_Occurred",
    "PyErr_Restore", "PyErr_SetObject", "PyErr_SetString", "PyErr_WarnEx", "PyErr_WriteUnraisable",
    "PyEval_AcquireThread", "PyEval_GetBuiltins", "PyEval_SaveThread", "PyExc_FutureWarning", "PyExc_ImportError",
    "PyExc_IndexError", "PyExc_MemoryError", "PyExc_OverflowError", "PyExc_RuntimeError", "PyExc_SystemError",
    "PyExc_TypeError", "PyExc_ValueError", "PyException_SetCause", "PyException_SetContext",
    "PyException_SetTraceback", "PyFloat_AsDouble", "PyFloat_FromDouble", "PyFloat_Type", "PyFrame_GetBack",
    "PyFrame_GetCode", "PyFrame_GetLineNumber", "PyFrozenSet_Type", "PyGILState_Check", "PyGILState_Ensure",
    "PyGILState_GetThisThreadState", "PyGILState_Release", "PyGen_Type", "PyIndex_Check", "PyInstanceMethod_New",
    "PyInstanceMethod_Type", "PyInterpreterState_GetDict", "PyIter_Next", "PyList_New", "PyList_Size",
    "PyLong_AsLong", "PyMem_Calloc", "PyMem_Free", "PyModuleDef_Init", "PyModule_AddObject", "PyModule_NewObject",
    "PyModule_Type", "PyNumber_Add", "PyNumber_Check", "PyNumber_Float", "PyNumber_Long",
    "PyObject_CallFunctionObjArgs", "PyObject_ClearWeakRefs", "PyObject_Free", "PyObject_GC_UnTrack",
    "PyObject_GetAttrString", "PyObject_GetItem", "PyObject_GetIter", "PyObject_HasAttrString",
    "PyObject_IsInstance", "PyObject_Repr", "PyObject_SetAttrString", "PyObject_SetItem", "PyObject_Str",
    "PyProperty_Type", "PySequence_Check", "PySequence_Size", "PySequence_Tuple", "PySet_Type",
    "PyThreadState_Clear", "PyThreadState_DeleteCurrent", "PyThreadState_New", "PyThread_tss_create",
    "PyThread_tss_delete", "PyThread_tss_get", "PyThread_tss_set", "PyTuple_New", "PyTuple_SetItem",
    "PyType_FromSpec", "PyType_IsSubtype", "PyType_Ready", "PyType_Type", "PyUnicode_AsEncodedString",
    "PyUnicode_AsUTF8AndSize", "PyUnicode_AsUTF8String", "PyUnicode_Compare", "PyUnicode_DecodeUTF8",
    "PyUnicode_FromString", "PyUnicode_InternFromString", "PyWeakref_NewRef", "Py_GetVersion",
    "_PyObject_GetDictPtr", "_PyObject_New", "_PyThreadState_UncheckedGet", "_PyType_Lookup", "_Py_Dealloc",
    "_Py_NoneStruct", "_Py_NotImplementedStruct",
})

# always refused, whatever a binding measured elsewhere imports: running or compiling code,
# importing, evaluating, the interpreter's globals, frames' variables, tracing, sys, whole
# interpreters
REFUSED_PYTHON_API = re.compile(
    r"^_?Py(Run_|Import_|_?CompileString|Eval_Eval|Eval_Get(Globals|Locals|Frame)|Eval_Set|Eval_MergeCompilerFlags|"
    r"Sys_|Marshal_|Code_|AST_|Parser|OS_|File_|Function_|Module_GetDict|Frame_(GetGlobals|GetLocals|GetBuiltins|"
    r"LocalsToFast|FastToLocals)|ThreadState_(GetFrame|SetAsyncExc)|Interpreter_New|Interpreter_Clear|Main|"
    r"Exec)|^_?Py_(Compile|NewInterpreter|EndInterpreter|Initialize|Finalize|Main|BytesMain|RunMain|Exit|AtExit|"
    r"SetProgramName|SetPath|Set)|^_PyEval_|^_PyRun_|^_PyImport_|^_PySys_")
# families of the Python C API that bindings use on the objects they are handed (type checks,
# conversions, errors, reference counts, pybind11's type registry): a binding built against
# another torch or pybind11 may import other members of them
BINDING_FAMILIES = re.compile(
    r"^_?Py(Err_|Exc_|Tuple_|List_|Dict_|Long_|Float_|Bool_|Unicode_|Bytes_|ByteArray_|Capsule_|Type_|Object_|Mem_|"
    r"Number_|Sequence_|Mapping_|Iter_|Index_|Slice_|Set_|FrozenSet_|Complex_|Weakref_|Exception_|CFunction_|"
    r"CMethod_|InstanceMethod_|Method_|Property_|StaticMethod_|ClassMethod_|Module_|ModuleDef_|GILState_|"
    r"Thread_tss_|ThreadState_|InterpreterState_Get|Gen_|Buffer_|MemoryView_|BaseObject_|Frame_Get|"
    r"Eval_(AcquireThread|ReleaseThread|SaveThread|RestoreThread|GetBuiltins|InitThreads|ThreadsInitialized))|"
    r"^_?Py_(Dealloc|NoneStruct|NotImplementedStruct|TrueStruct|FalseStruct|EllipsisObject|GetVersion|IncRef|"
    r"DecRef|XIncRef|XDecRef|IsInitialized|IsFinalizing|IsNone|IsTrue|IsFalse|Is|NewRef|XNewRef|RefTotal|"
    r"DecRefTotal|IncRefTotal)$|^_PyObject_|^_PyThreadState_UncheckedGet$|^_PyType_Lookup$")
DYNAMIC_LOOKUP = frozenset({"dlsym", "dlvsym", "dlopen", "dlmopen", "dl_iterate_phdr", "_dl_sym", "__libc_dlsym",
                            "__libc_dlopen_mode", "_dl_find_object", "dladdr", "dladdr1", "dlinfo"})
_LIBPYTHON = re.compile(r"^libpython\d")
# names of the interpreter inside a library's data (what a run-time lookup would ask for)
_NAMES_PYTHON = re.compile(rb"libpython\d[\w.]*|_?Py[A-Z][A-Za-z]+_[A-Za-z]\w*")
ELF_MAGIC = b"\x7fELF"
MAX_BYTES = 2 << 30


class NotElf(ValueError):
    pass


@dataclass
class DynamicSymbols:
    path: str
    undefined: set[str] = field(default_factory=set)
    needed: list[str] = field(default_factory=list)
    python_module: bool = False  # defines PyInit_<name>: a Python extension module
    loadable: bool = True  # a shared object (ET_DYN); an object file or an executable cannot be dlopen()ed
    sections: set[str] = field(default_factory=set)
    data: bytes = b""

    @property
    def static_cuda_runtime(self) -> bool:
        """CUDA device code with the CUDA runtime linked in (nvcc's default ``-cudart static``):
        the runtime loads the driver with ``dlopen``/``dlsym`` itself."""
        return bool(self.sections & {".nv_fatbin", "__nv_relfatbin"}) and not any(
            n.startswith("libcudart") for n in self.needed)


def is_elf(path: str | Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == ELF_MAGIC
    except OSError:
        return False


def read_symbols(path: str | Path) -> DynamicSymbols:
    """The undefined dynamic symbols and the needed libraries of a shared object."""
    data = Path(path).read_bytes()
    return parse_symbols(data, str(path))


def parse_symbols(data: bytes, path: str = "") -> DynamicSymbols:
    if data[:4] != ELF_MAGIC or len(data) < 64:
        raise NotElf(f"{path or 'the file'} is not an ELF file")
    cls, enc = data[4], data[5]
    if cls not in (1, 2) or enc not in (1, 2):
        raise NotElf(f"{path or 'the file'}: unknown ELF class or byte order")
    e = "<" if enc == 1 else ">"
    is64 = cls == 2
    if is64:
        shoff, = struct.unpack_from(e + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(e + "HH", data, 0x3A)
    else:
        shoff, = struct.unpack_from(e + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(e + "HH", data, 0x2E)
    out = DynamicSymbols(path)
    e_type, = struct.unpack_from(e + "H", data, 0x10)
    out.loadable = e_type == 3  # ET_DYN
    sections = []
    for i in range(shnum):
        off = shoff + i * shentsize
        if off + shentsize > len(data):
            raise NotElf(f"{path or 'the file'}: truncated section table")
        if is64:
            _name, stype, _flags, _addr, soff, ssize, link, _info, _align, entsize = struct.unpack_from(
                e + "IIQQQQIIQQ", data, off)
        else:
            _name, stype, _flags, _addr, soff, ssize, link, _info, _align, entsize = struct.unpack_from(
                e + "IIIIIIIIII", data, off)
        sections.append((stype, soff, ssize, link, entsize, _name))

    def strtab(idx: int) -> bytes:
        if not 0 <= idx < len(sections):
            return b""
        _t, soff, ssize, _l, _e, _n = sections[idx]
        return data[soff:soff + ssize]

    def name_at(table: bytes, off: int) -> str:
        end = table.find(b"\0", off)
        return table[off:end if end >= 0 else len(table)].decode("latin-1")

    SHT_DYNSYM, SHT_DYNAMIC = 11, 6
    shstrndx, = struct.unpack_from(e + "H", data, 0x3E if is64 else 0x32)
    names_of_sections = strtab(shstrndx)
    out.sections = {name_at(names_of_sections, sec[5]) for sec in sections}
    out.data = data
    for stype, soff, ssize, link, entsize, _sname in sections:
        if stype == SHT_DYNSYM:
            names = strtab(link)
            size = entsize or (24 if is64 else 16)
            for k in range(1, ssize // size):
                off = soff + k * size
                if is64:
                    st_name, st_info, _other, st_shndx = struct.unpack_from(e + "IBBH", data, off)
                else:
                    st_name, = struct.unpack_from(e + "I", data, off)
                    st_info, _other, st_shndx = struct.unpack_from(e + "BBH", data, off + 12)
                if st_shndx == 0 and st_name:
                    out.undefined.add(name_at(names, st_name).split("@")[0])
                elif st_name and name_at(names, st_name).startswith("PyInit_"):
                    out.python_module = True
        elif stype == SHT_DYNAMIC:
            names = strtab(link)
            size = entsize or (16 if is64 else 8)
            for k in range(ssize // size):
                tag, val = struct.unpack_from(e + ("qQ" if is64 else "iI"), data, soff + k * size)
                if tag == 0:
                    break
                if tag == 1:  # DT_NEEDED
                    out.needed.append(name_at(names, val))
    return out


def python_api(symbols: set[str]) -> set[str]:
    return {s for s in symbols if s.startswith(("Py", "_Py"))}


def refusals(syms: DynamicSymbols, kind: str) -> list[str]:
    """What in ``syms`` an honest library of ``kind`` (``ctypes`` or ``torch_extension``)
    does not need, one line per finding."""
    found = []
    for lib in syms.needed:
        if _LIBPYTHON.match(lib):
            found.append(f"links {lib}")
    if syms.static_cuda_runtime:  # the runtime's own lookups: judged by what they name instead
        # a name the library imports as a symbol is judged below as a call (its string table
        # holds it for the loader); any other name of the interpreter is a run-time lookup's
        named = sorted({m.group(0).decode() for m in _NAMES_PYTHON.finditer(syms.data)}
                       - {s for s in syms.undefined if binding_may_call(s, kind)})
        found += [f"names {n} (a library with the CUDA runtime linked in looks it up at run time)" for n in named[:3]]
    else:
        for s in sorted(syms.undefined & DYNAMIC_LOOKUP):
            found.append(f"calls {s}() (looks symbols up or loads libraries at run time)")
    for s in sorted(python_api(syms.undefined)):
        if not binding_may_call(s, kind):
            found.append(f"calls the Python C API ({s})")
    return found


def binding_may_call(symbol: str, kind: str) -> bool:
    """Whether an honest library of ``kind`` may import the Python C API ``symbol``."""
    if kind != "torch_extension" or REFUSED_PYTHON_API.match(symbol):
        return False
    return symbol in BINDING_PYTHON_API or bool(BINDING_FAMILIES.match(symbol))


def check_file(path: str | Path, kind: str, label: str = "") -> list[str]:
    """Refusal messages for one file (none when it is not an ELF file); ``kind`` "auto": a
    Python extension module (it defines ``PyInit_*``) is a torch extension, else a kernel library."""
    if not is_elf(path):
        return []
    try:
        syms = read_symbols(path)
    except (OSError, NotElf, struct.error) as exc:
        return [f"{label or Path(path).name}: cannot be read as a shared object ({exc}) (rule {RULE}: a kernel "
                f"library must be an ordinary shared object)"]
    if not syms.loadable:  # a compiler's object file or a program: no process loads it
        return []
    if kind == "auto":
        kind = "torch_extension" if syms.python_module else "ctypes"
    what = refusals(syms, kind)
    if not what:
        return []
    more = f" and {len(what) - 1} more" if len(what) > 1 else ""
    hint = ("a kernel library exports extern \"C\" functions and calls no Python" if kind == "ctypes" else
            "bindings take and return tensors through pybind11 and call no other Python")
    return [f"{label or Path(path).name}: {what[0]}{more} (rule {RULE}: {hint}; run no Python from C++, and look "
            f"nothing up at run time)"]


def check_tree(root: str | Path, kinds: dict[str, str] | None = None, default_kind: str = "torch_extension",
               limit: int = 200) -> list[str]:
    """Refusal messages for every ELF file under ``root`` (links not followed); ``kinds`` maps
    a file's path relative to ``root`` to its kind."""
    out = []
    root = Path(root)
    seen = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file() or not is_elf(p):
                continue
            seen += 1
            if seen > limit:
                return out
            rel = str(p.relative_to(root))
            out.extend(check_file(p, (kinds or {}).get(rel, default_kind), rel))
    return out


def job_findings(snapshot_root: str | Path, prebuilt: str | Path | None = None) -> list[str]:
    """Refusals for what a job's candidate process would load: every ELF file of the job's
    copy (the build its manifest names judged by the manifest's kind, any other as a kernel
    library) and the extensions built ahead for it (torch extensions)."""
    import json

    root = Path(snapshot_root)
    kinds = {}
    try:
        man = json.loads((root / ".cuda_agent" / "build" / "manifest.json").read_text())
        if man.get("artifact"):
            kinds[f".cuda_agent/build/{man['artifact']}"] = str(man.get("kind") or "ctypes")
    except (OSError, ValueError, AttributeError):
        pass
    found = check_tree(root, kinds, default_kind="ctypes")
    if prebuilt:
        found += [f"the build made ahead: {f}" for f in check_tree(prebuilt, default_kind="torch_extension")]
    return found


def mapped_findings(pids: list[int], owner: int, seen: set | None = None) -> list[str]:
    """Refusals for the shared objects that processes ``pids`` have mapped executable and
    that ``owner`` (the job's own user) made: what the candidate built and loaded inside its
    own process (a compiler run at import, ``load_inline`` without a build made ahead),
    judged from this side through ``/proc/<pid>/map_files`` after the fact. ``seen`` (file
    identities already judged) is updated. Mappings that cannot be read are skipped."""
    seen = set() if seen is None else seen
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            parts = line.split(None, 5)
            if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
                continue
            mf = f"/proc/{pid}/map_files/{parts[0]}"
            try:
                st = os.stat(mf)
            except OSError:
                continue
            ident = (st.st_dev, st.st_ino)
            if st.st_uid != owner or ident in seen:
                continue
            seen.add(ident)
            name = parts[5].replace(" (deleted)", "")
            out.extend(check_file(mf, "auto", f"{name} (loaded by the candidate process)"))
    return out
