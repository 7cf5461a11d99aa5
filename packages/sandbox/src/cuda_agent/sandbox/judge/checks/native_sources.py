"""Static check: kernel sources run no Python (rule ``native.python-api``, on the sources).

A binding takes tensors from Python and returns tensors; it has no use for the interpreter
itself. The built library's symbols are judged where it is loaded
(:mod:`.native_symbols`); this check refuses, on the sources (kernel files and C++ strings
of a single-file solution, comments and strings removed), what the symbols cannot tell
from an honest binding's: the Python C API named in the candidate's own code
(``PyEval_GetBuiltins``, ``PyObject_GetAttrString``, ... an honest binding gets them only
from pybind11's headers), pybind11's ways into the interpreter (``py::module_::import``,
``py::exec``, ``py::eval``, ``py::globals``) and run-time symbol lookup (``dlsym``,
``dlopen``).
"""

from __future__ import annotations

import re
from pathlib import Path

from .base import StaticCheck, line_of, strip_cxx

_PYTHON_API = re.compile(r"\b_?Py[A-Z][A-Za-z0-9]*_[A-Za-z0-9_]+\b|\b_Py[A-Za-z0-9_]+\b|\bPy_[A-Za-z0-9_]+\b")
_PYBIND_INTERPRETER = re.compile(
    r"\b(?:py|pybind11)\s*::\s*(?:module_?\s*::\s*import|exec|eval|eval_file|globals|builtins|"
    r"scoped_interpreter|initialize_interpreter|finalize_interpreter)\b")
_LOOKUP = re.compile(r"\b(?:dlsym|dlvsym|dlopen|dlmopen|dl_iterate_phdr|RTLD_[A-Z]+)\b")
# names from pybind11's and torch's own macros an honest binding may spell
_ALLOWED = frozenset({"PYBIND11_MODULE", "Py_ssize_t"})


class NativePythonCheck(StaticCheck):
    name = "no_native_python"
    rule = "native.python-api"
    why = ("kernel sources run no Python: bindings take and return tensors through pybind11 and look nothing up "
           "at run time")
    description = "Refuses the Python C API, pybind11's interpreter entry points and dlsym/dlopen in kernel sources."

    def check(self, workspace: Path, candidate=None) -> list[str]:
        out: list[str] = []
        for label, first_line, raw in self.kernel_sources(Path(workspace), candidate):
            text = strip_cxx(raw)
            for pattern, what in ((_PYTHON_API, "calls the Python C API"),
                                  (_PYBIND_INTERPRETER, "enters the interpreter through pybind11"),
                                  (_LOOKUP, "looks symbols up or loads libraries at run time")):
                for m in pattern.finditer(text):
                    name = re.sub(r"\s+", "", m.group(0))
                    if name in _ALLOWED:
                        continue
                    where = f"{label}:{first_line - 1 + line_of(text, m.start())}"
                    out.append(self.violation(where, f"{what} ({name})"))
        return out
