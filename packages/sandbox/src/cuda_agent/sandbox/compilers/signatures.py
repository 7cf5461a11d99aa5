"""``extern "C"`` function declarations parsed from C/C++/CUDA sources.

The ctypes loader needs each function's argument types (passing a Python float where
C expects ``float`` is otherwise undefined behaviour). They are read from the sources
at build time and written to the build manifest.
"""

from __future__ import annotations

import re

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"')
# extern "C" <decl> ( args ) {   or   extern "C" { ... }  blocks
_SINGLE = re.compile(r'extern\s+"C"\s+(?!\{)(?P<decl>[^;{(]*?)\b(?P<name>[A-Za-z_]\w*)\s*\((?P<args>[^)]*)\)\s*\{')
_BLOCK = re.compile(r'extern\s+"C"\s*\{')
_FUNC = re.compile(r'(?P<decl>[A-Za-z_][\w\s\*&:<>,]*?)\b(?P<name>[A-Za-z_]\w*)\s*\((?P<args>[^)]*)\)\s*\{')

_INT_TYPES = {
    "char": "i8", "signed char": "i8", "unsigned char": "u8", "int8_t": "i8", "uint8_t": "u8",
    "short": "i16", "unsigned short": "u16", "int16_t": "i16", "uint16_t": "u16",
    "int": "i32", "signed": "i32", "signed int": "i32", "unsigned": "u32", "unsigned int": "u32",
    "int32_t": "i32", "uint32_t": "u32",
    "long": "i64", "long int": "i64", "unsigned long": "u64", "long long": "i64",
    "long long int": "i64", "unsigned long long": "u64", "int64_t": "i64", "uint64_t": "u64",
    "size_t": "u64", "ssize_t": "i64", "ptrdiff_t": "i64", "intptr_t": "i64", "uintptr_t": "u64",
    "bool": "bool", "float": "f32", "double": "f64", "void": "void",
}
_POINTERISH = {"cudaStream_t", "cudaEvent_t", "cublasHandle_t", "cudnnHandle_t", "CUstream"}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "static", "inline",
               "__host__", "__device__", "__forceinline__", "struct", "enum", "std::", "register"}


class SignatureError(ValueError):
    pass


def _type_code(text: str, where: str) -> str:
    t = text.strip()
    if not t:
        raise SignatureError(f"{where}: empty type")
    if "*" in t or "&" in t or "[" in t:
        return "ptr"
    words = [w for w in re.split(r"\s+", t.replace("std::", "")) if w and w not in _QUALIFIERS]
    base = " ".join(words)
    if base in _POINTERISH:
        return "ptr"
    if base in _INT_TYPES:
        return _INT_TYPES[base]
    raise SignatureError(
        f"{where}: type {t!r} is not supported in an extern \"C\" launcher; use pointers, "
        "integer types, float, double or bool"
    )


def _strip_param_name(param: str) -> str:
    p = param.strip()
    p = re.sub(r"=.*$", "", p).strip()  # default values
    if p.endswith("]"):
        return p  # array parameter, pointer anyway
    m = re.match(r"^(.*?[\s\*&])([A-Za-z_]\w*)$", p)
    if m and m.group(1).strip() and m.group(2) not in _INT_TYPES and m.group(2) not in _POINTERISH:
        return m.group(1)
    return p


def _signature(decl: str, name: str, args: str, where: str) -> dict:
    ret = decl.strip()
    for q in ("__global__",):
        if q in ret.split():
            raise SignatureError(f"{where}: {name} is a __global__ kernel; export a host launcher instead")
    ret_words = [w for w in ret.split() if w not in {"static", "inline", "__host__", "__attribute__((visibility(\"default\")))"}]
    restype = _type_code(" ".join(ret_words) or "void", f"{where}: return type of {name}")
    argtypes = []
    a = args.strip()
    if a and a != "void":
        for i, param in enumerate(a.split(",")):
            argtypes.append(_type_code(_strip_param_name(param), f"{where}: argument {i + 1} of {name}"))
    return {"restype": restype, "argtypes": argtypes}


def _clean(source: str) -> str:
    source = _COMMENT.sub(" ", source)
    source = _STRING.sub(lambda m: m.group(0) if m.group(0) == '"C"' else '""', source)
    return re.sub(r"^\s*#.*$", " ", source, flags=re.M)


def _matching_brace(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return len(text)


def extern_c_functions(source: str, where: str = "") -> dict[str, dict]:
    """``{name: {"restype": code, "argtypes": [code, ...]}}`` of the defined extern "C" functions."""
    text = _clean(source)
    out: dict[str, dict] = {}
    for m in _SINGLE.finditer(text):
        out[m.group("name")] = _signature(m.group("decl"), m.group("name"), m.group("args"), where)
    for m in _BLOCK.finditer(text):
        end = _matching_brace(text, m.end() - 1)
        body = text[m.end():end]
        depth = 0
        i = 0
        # only top-level definitions inside the block
        while i < len(body):
            fm = _FUNC.match(body, i) if depth == 0 else None
            if fm and not fm.group("decl").strip().endswith(("return", "else")):
                decl = fm.group("decl")
                if decl.strip() and "=" not in decl:
                    out[fm.group("name")] = _signature(decl, fm.group("name"), fm.group("args"), where)
                brace = fm.end() - 1
                i = _matching_brace(body, brace) + 1
                continue
            ch = body[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == ";" and depth == 0:
                pass
            i += 1
    return out
