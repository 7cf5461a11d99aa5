"""Builds cannot read what is not theirs (compilers.jail, compilers.source_check, compilers.frozen).

Each attack below made the compiler, the assembler or a diagnostic read a host file when
builds ran as root with root's view: the secret is a file of the test's own that only root
may read, and /etc/shadow. Each must now end refused, or built without the secret: not in
the errors, not in the log, not in the library. The honest twins (ordinary includes of
system headers, OpenMP, a local header, a header of a sub-folder) must build and run.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from cuda_agent.core.cli import main
from cuda_agent.core.types import Task
from cuda_agent.sandbox.compilers import GxxCompiler, NvccCompiler
from cuda_agent.sandbox.compilers.jail import BUILD_UID_BASE, BUILD_UID_COUNT, why_not_jailed
from cuda_agent.sandbox.compilers.source_check import RULE_FILES, RULE_READS, parse_depfile
from cuda_agent.sandbox.workspace.workspace import create_workspace

TASK = ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return x * 3.0\n\n\ndef get_inputs():\n    return [torch.randn(16)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
MARK = "TOPSECRET-build-9e4b"
ENV_MARK = "sk-ENVSECRET-31337"
ADD = 'extern "C" int add1(int x) { return x + 1; }\n'
JAILED = pytest.mark.skipif(bool(why_not_jailed()), reason=f"no build jail here: {why_not_jailed()}")
NEEDS_NVCC = pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                                reason="nvcc not installed")


@pytest.fixture(scope="module")
def secret(tmp_path_factory):
    """A file only root may read, in a folder only root may enter."""
    d = tmp_path_factory.mktemp("rootonly")
    os.chmod(d, 0o700)
    p = d / "secret.txt"
    p.write_text(MARK + "\n")
    os.chmod(p, 0o600)
    return str(p)


@pytest.fixture()
def env_secret(monkeypatch):
    monkeypatch.setenv("CUDA_AGENT_TEST_API_KEY", ENV_MARK)


def workspace(tmp_path, files: dict[str, str], backend="cpu", compiler=None):
    ws = create_workspace(Task(id="t", source="test", code=TASK), tmp_path / "ws", backend=backend,
                          compiler=compiler)
    for rel, text in files.items():
        p = ws.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return ws


def gxx(tmp_path, **kw):
    return GxxCompiler(GxxCompiler.Options(cache_dir=str(tmp_path / "cache"), **kw))


def leaked(r, secrets=(MARK, ENV_MARK, "root:*:", "root:!")) -> list[str]:
    """Where a secret (or a line of /etc/shadow) shows: errors, log, the built library."""
    where = []
    text = "\n".join(r.errors) + "\n" + (r.log or "")
    shadow = _shadow_lines()
    for s in (*secrets, *shadow):
        if s.lower() in text.lower():
            where.append(f"message: {s}")
    if r.ok and r.artifact:
        data = Path(r.artifact).read_bytes()
        for s in (*secrets, *shadow):
            if s.encode() in data:
                where.append(f"library: {s}")
    return where


def _shadow_lines() -> list[str]:
    try:
        return [ln for ln in Path("/etc/shadow").read_text().splitlines() if len(ln) > 8][:3]
    except OSError:
        return []


# --- honest twins ---------------------------------------------------------------------------

HONEST = {
    "kernels/common.h": "#pragma once\n#include <cmath>\ninline float twice(float v) { return 2.f * v; }\n",
    "kernels/sub/more.h": '#pragma once\n#include "../common.h"\ninline int plus(int a) { return a + (int)twice(1.f); }\n',
    "kernels/add.cpp": ('#include <vector>\n#include <cstdint>\n#include <omp.h>\n#include "common.h"\n'
                        '#include "sub/more.h"\n'
                        'extern "C" int add3(int x) { std::vector<int> v{x}; return plus(v[0]) + 1; }\n'),
}


def test_honest_build_with_ordinary_includes_builds_and_runs(tmp_path):
    ws = workspace(tmp_path, HONEST)
    r = gxx(tmp_path).build(ws.root)
    assert r.ok, (r.errors, r.log)
    assert ctypes.CDLL(r.artifact).add3(4) == 7
    assert not leaked(r)


@JAILED
def test_honest_build_ran_in_the_jail(tmp_path):
    import json

    ws = workspace(tmp_path, HONEST)
    r = gxx(tmp_path).build(ws.root)
    assert r.ok, r.errors
    man = json.loads((ws.build_dir / "manifest.json").read_text())
    assert man["jail"] == "yes"
    st = os.stat(r.artifact)
    assert st.st_uid == 0  # the build user's output is root's once taken


# --- attacks: what the compiler reads -------------------------------------------------------

def _variants(secret: str) -> dict[str, str]:
    return {
        "line_splice": f'#incl\\\nude "{secret}"\n',
        "comment_in_directive": f'#include /* x */ "{secret}"\n',
        "digraph": f'%:include "{secret}"\n',
        "macro_expansion": f'#define S(x) #x\n#define P(x) S(x)\n#include P({secret})\n',
        "asm_include": f'asm(".include \\"{secret}\\"");\n',
        "incbin_split_literals": f'asm(".section .rodata\\n.globl s\\ns: .inc" "bin \\"{secret}\\"\\n.byte 0\\n.text");\n',
        "incbin_shadow_split": 'asm(".section .rodata\\n.globl t\\nt: .inc" "bin \\"/etc/shadow\\"\\n.byte 0\\n.text");\n',
        "include_shadow": '#include "/etc/shadow"\n',
        "line_then_error": f'#line 1 "{secret}"\nint broken = ;\n',
        "pragma_dependency": f'_Pragma("GCC dependency \\"{secret}\\"")\n',
        "pragma_include_flag": f'#pragma GCC optimize ("-include{secret}")\n',
        "embed": f'#embed "{secret}"\n',
        "proc_environ": '#include "/proc/self/environ"\n',
        "incbin_environ": 'asm(".section .rodata\\n.globl e\\ne: .incbin \\"/proc/self/environ\\"\\n.text");\n',
        "include_parent_climb": '#include "../../../../../../../../../etc/shadow"\n',
    }


VARIANTS = list(_variants("S"))


@pytest.mark.parametrize("name", VARIANTS)
def test_attack_reads_nothing_secret(tmp_path, secret, env_secret, name):
    src = _variants(secret)[name]
    ws = workspace(tmp_path, {"kernels/a.cpp": src + ADD})
    r = gxx(tmp_path).build(ws.root)
    assert not leaked(r), (name, leaked(r), r.errors)
    if name in ("proc_environ", "incbin_environ"):
        # /proc/self/environ is readable by any process: what it holds is the tool's own
        # environment (no variable of the host process), and the read is refused by rule
        assert not r.ok and any(f"rule {RULE_READS}" in e for e in r.errors), r.errors
    if name not in ("pragma_dependency", "pragma_include_flag"):  # these name a file, read nothing of it
        assert not r.ok, (name, r.errors)


@JAILED
def test_has_include_cannot_probe_host_files(tmp_path, secret):
    """__has_include answers for the jail's view: the secret and /root are not there."""
    src = (f'#if __has_include("{secret}")\nextern "C" int seen() {{ return 1; }}\n'
           f'#elif __has_include(</etc/shadow>)\nextern "C" int seen() {{ return 2; }}\n'
           '#else\nextern "C" int seen() { return 0; }\n#endif\n')
    ws = workspace(tmp_path, {"kernels/a.cpp": src})
    r = gxx(tmp_path).build(ws.root)
    assert r.ok, r.errors
    assert ctypes.CDLL(r.artifact).seen() == 0


@JAILED
def test_the_jail_shows_no_host_file(tmp_path, secret, env_secret):
    """What a tool sees in the jail: no /root, no /home, no /etc/shadow, no secret, no host
    process, the build user's identity, and only the toolchain's variables."""
    from cuda_agent.sandbox.compilers.buildcache import ToolLimits, run_tool
    from cuda_agent.sandbox.compilers.jail import ToolView

    src = tmp_path / "src"
    src.mkdir()
    os.chmod(src, 0o755)
    script = (f"id -u; ls /root /home 2>&1; cat /etc/shadow {secret} 2>&1; ls /proc | grep -c '^[0-9]'; env; "
              f"touch /usr/x 2>&1; touch {tmp_path}/out/ok && echo wrote")
    r = run_tool(["/bin/sh", "-c", script], src, ToolLimits(timeout_s=60),
                 view=ToolView(sources=str(src), output=str(tmp_path / "out")))
    out = r.output
    uid = int(out.splitlines()[0])
    assert BUILD_UID_BASE <= uid < BUILD_UID_BASE + BUILD_UID_COUNT, out
    assert "'/root': No such file" in out and "'/home': No such file" in out, out
    assert "/etc/shadow: No such file" in out and f"{secret}: No such file" in out, out
    assert MARK not in out and ENV_MARK not in out and "CUDA_AGENT" not in out, out
    assert "Read-only file system" in out or "Permission denied" in out, out
    assert "wrote" in out
    from cuda_agent.sandbox.isolation.sandboxes.sweeps import processes_of_uid

    assert not processes_of_uid(uid)


# --- attacks: links among the sources ---------------------------------------------------------

def _link_case(tmp_path, secret, kind):
    ws = workspace(tmp_path, {"kernels/add.cpp": '#include "h.h"\n' + ADD, "kernels/h.h": "#pragma once\n"})
    k = ws.root / "kernels"
    if kind == "symlink":
        (k / "x.cpp").symlink_to(secret)
        return ws, "kernels/x.cpp"
    if kind == "hardlink":
        os.link(secret, k / "x.cpp")
        return ws, "kernels/x.cpp"
    if kind == "header_symlink":
        (k / "h.h").unlink()
        (k / "h.h").symlink_to(secret)
        return ws, "kernels/h.h"
    if kind == "kernels_folder":
        outside = tmp_path / "outside"
        shutil.copytree(k, outside)
        (outside / "x.cpp").symlink_to(secret)
        shutil.rmtree(k)
        k.symlink_to(outside)
        return ws, "kernels"
    if kind == "top_header_symlink":
        (ws.root / "evil.h").symlink_to(secret)
        (k / "add.cpp").write_text('#include "evil.h"\n' + ADD)
        return ws, "evil.h"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "header_symlink", "kernels_folder", "top_header_symlink"])
def test_links_among_the_sources_refuse_the_build(tmp_path, secret, kind):
    ws, where = _link_case(tmp_path, secret, kind)
    r = gxx(tmp_path).build(ws.root)
    assert not r.ok and f"rule {RULE_FILES}" in r.errors[0] and r.errors[0].startswith(where), r.errors
    assert "write the file itself into kernels/" in r.errors[0]
    assert not leaked(r)


# --- limits --------------------------------------------------------------------------------------

def test_compile_output_is_bounded(tmp_path):
    src = "".join(f'#warning "{"w" * 200} {i}"\n' for i in range(3000)) + ADD + "int broken = ;\n"
    ws = workspace(tmp_path, {"kernels/a.cpp": src})
    r = gxx(tmp_path).build(ws.root)
    assert not r.ok and len(r.log) <= 4000 and len(r.errors) <= 6, (len(r.log), r.errors[:2])


def test_compile_time_limit(tmp_path):
    bomb = "#define A0 x x x x\n" + "".join(f"#define A{i} A{i - 1} A{i - 1} A{i - 1} A{i - 1}\n"
                                              for i in range(1, 16)) + "int v = sizeof(#A15);\n"
    ws = workspace(tmp_path, {"kernels/a.cpp": bomb + ADD})
    r = gxx(tmp_path, unit_timeout_s=3).build(ws.root)
    assert not r.ok and any("timed out after 3 s" in e or "timed out" in e for e in r.errors + [r.log]), r.errors


def test_compile_file_size_limit(tmp_path):
    ws = workspace(tmp_path, {"kernels/a.cpp": "char big[8 << 20] = {1};\n" + ADD})
    r = gxx(tmp_path, file_size_mb=2).build(ws.root)
    assert not r.ok, r.errors
    assert gxx(tmp_path / "2", file_size_mb=64).build(ws.root).ok


# --- CUDA sources (nvcc compiles and links here; nothing CUDA runs) -------------------------------

CU_OK = ('#include <cuda_runtime.h>\n#include "local.cuh"\n'
         '__global__ void k(float* x) { x[threadIdx.x] = twice(x[threadIdx.x]); }\n'
         'extern "C" void launch(float* x) { k<<<1, 32>>>(x); }\n')
LOCAL_CUH = "#pragma once\n__device__ inline float twice(float v) { return 2.f * v; }\n"


@NEEDS_NVCC
def test_nvcc_honest_and_incbin_in_a_cu(tmp_path, secret):
    nv = NvccCompiler(NvccCompiler.Options(cache_dir=str(tmp_path / "cache")))
    ws = workspace(tmp_path / "honest", {"kernels/k.cu": CU_OK, "kernels/local.cuh": LOCAL_CUH},
                   backend="cuda", compiler="nvcc")
    r = nv.build(ws.root)
    assert r.ok, (r.errors, r.log)
    for name, src in (("incbin", f'asm(".section .rodata\\n.globl s\\ns: .inc" "bin \\"{secret}\\"\\n.text");\n'),
                      ("digraph", f'%:include "{secret}"\n'),
                      ("device_only", f'#ifdef __CUDA_ARCH__\n#include "{secret}"\n#endif\n')):
        ws = workspace(tmp_path / name, {"kernels/k.cu": src + CU_OK, "kernels/local.cuh": LOCAL_CUH},
                       backend="cuda", compiler="nvcc")
        r = nv.build(ws.root)
        assert not r.ok and not leaked(r), (name, r.errors)


@NEEDS_NVCC
def test_nvcc_host_compiler_headers_are_the_toolchains(tmp_path):
    """nvcc compiles a .cu's host side with its own host compiler (gcc from the search path),
    whose internal headers (limits.h, stddef.h) need not be on the C++ compiler's search list:
    a g++ of another version, or one that prints none, must not refuse an honest build."""
    from cuda_agent.sandbox.compilers.source_check import ccbin_flags, nvcc_host_compiler

    fake = tmp_path / "toolchain" / "bin" / "other-g++"  # its tree is shown read-only in the jail
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\ncase " $* " in *" -v "*) exit 1;; esac\nexec g++ "$@"\n')
    fake.chmod(0o755)
    nvcc = shutil.which("nvcc")
    host = nvcc_host_compiler(nvcc)
    assert host and os.path.basename(host).startswith(("gcc", "cc", "c++", "g++", "clang"))
    assert nvcc_host_compiler(nvcc, ccbin_flags(["-O3", "-ccbin", str(fake)])) == str(fake)
    nv = NvccCompiler(NvccCompiler.Options(cache_dir=str(tmp_path / "cache"), cxx=str(fake)))
    ws = workspace(tmp_path / "honest", {"kernels/k.cu": "#include <climits>\n#include <cstddef>\n" + CU_OK,
                                         "kernels/local.cuh": LOCAL_CUH}, backend="cuda", compiler="nvcc")
    r = nv.build(ws.root)
    assert r.ok, (r.errors, r.log)


# --- the dependency lists -------------------------------------------------------------------------

def test_parse_depfile():
    text = "a.o : a.cu \\\n    /usr/include/x.h \\\n    my\\ dir/h.h\nb.o: /tmp/cc1.s $$x\n"
    assert parse_depfile(text) == ["a.cu", "/usr/include/x.h", "my dir/h.h", "/tmp/cc1.s", "$x"]


# --- cuda-agent verify on a folder holding links -------------------------------------------------

@pytest.mark.parametrize("where", ["kernels/x.cpp", "model_new.py", "model.py"])
def test_verify_cli_refuses_links_with_the_rule(tmp_path, secret, capfd, where):
    """Before: a kernels/x.cpp link was skipped and the folder passed; a model_new.py link
    failed with the template's NotImplementedError. Now: refused, naming the link and the
    rule, exit status 1, nothing built or run."""
    folder = tmp_path / "sol"
    (folder / "kernels").mkdir(parents=True)
    (folder / "model.py").write_text(TASK)
    (folder / "model_new.py").write_text("import torch\nclass ModelNew(torch.nn.Module):\n"
                                          "    def forward(self, x):\n        return x * 3.0\n")
    (folder / "kernels" / "k.cpp").write_text(ADD)
    p = folder / where
    if p.exists():
        p.unlink()
    p.symlink_to(secret)
    assert main(["verify", str(folder), "backend=cpu"]) == 1
    out = capfd.readouterr()
    text = out.out + out.err
    assert "VERIFY FAILED" in text and "rule judge.files" in text and where in text, text
    assert "symbolic link" in text and MARK not in text and "NotImplementedError" not in text, text


def test_no_build_user_process_is_left(tmp_path):
    """Every tool run's processes end with it (the jail's PID namespace, then the sweep)."""
    ws = workspace(tmp_path, HONEST)
    assert gxx(tmp_path).build(ws.root).ok

    def build_user_processes() -> set[str]:
        found = set()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/status") as f:
                    uids = next(ln.split()[1:] for ln in f if ln.startswith("Uid:"))
                with open(f"/proc/{pid}/stat") as f:
                    start = f.read().rsplit(")", 1)[1].split()[19]
            except (OSError, StopIteration, IndexError):
                continue
            if any(BUILD_UID_BASE <= int(u) < BUILD_UID_BASE + BUILD_UID_COUNT for u in uids):
                found.add(f"{pid}@{start}")
        return found

    # another test worker's build may be running now: its tools end with it, a leak never does
    left = build_user_processes()
    deadline = time.monotonic() + 180
    while left and time.monotonic() < deadline:
        time.sleep(1)
        left &= build_user_processes()
    assert not left


def test_a_toolchain_header_read_through_a_link_is_the_toolchains(tmp_path):
    # nvcc under /usr/local/cuda -> /usr/local/cuda-13.0 reads its headers by the link's name
    from cuda_agent.sandbox.compilers.source_check import allowed_roots, outside_reads

    real = tmp_path / "cuda-13.0" / "targets" / "include"
    real.mkdir(parents=True)
    (real / "cuda_runtime.h").write_text("// toolchain\n")
    link = tmp_path / "cuda"
    link.symlink_to(tmp_path / "cuda-13.0")
    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    roots = allowed_roots([str(tmp_path / "cuda-13.0")])
    read = [str(link / "targets" / "include" / "cuda_runtime.h"), str(secret)]
    assert outside_reads(read, str(tmp_path), roots) == [str(secret)]
