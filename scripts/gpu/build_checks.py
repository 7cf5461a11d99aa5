"""GPU check: builds run in the build jail, honest CUDA builds still build and load, and no
attack reads a root-only secret.

Run from the repo root on a GPU machine, as root: ``python3 scripts/gpu/build_checks.py``.
An honest ``cpp_extension`` workspace (the CUDA ReLU of ``bench_reward``: a ``.cu`` kernel and
a torch binding) is built, imported and run on the GPU against ``torch.relu``; then each attack
(line splice, comment in the directive, digraph, macro-made include, assembler ``.include``,
``.incbin`` split across literals, ``/etc/shadow``, ``/proc/self/environ``, a device-only
include, a link among the sources) is built with the ``nvcc`` and ``cpp_extension`` compilers.
Prints one row per build: whether it built, whether the secret (a file only root may read,
/etc/shadow's lines, a variable of this process's environment) shows in the errors, the log or
the library; writes JSON under ``$OUT``. Passes when the honest build runs correctly and no row
leaks. Under 3 minutes (most of it the torch precompiled header, once).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
for p in ("core", "sandbox"):
    sys.path.insert(0, str(ROOT / "packages" / p / "src"))

from bench_reward import RELU_BINDING, RELU_KERNEL  # noqa: E402

MARK = "TOPSECRET-gpu-build-4c2f"
ENV_MARK = "sk-GPUENVSECRET-271828"
TASK = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return torch.relu(x)\n\ndef get_inputs():\n    return [torch.randn(8192)]\n\n"
        "def get_init_inputs():\n    return []\n")
CU = ('__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n'
      'extern "C" void launch(float* x) { k<<<1, 32>>>(x); }\n')


def attacks(secret: str) -> dict[str, str]:
    return {
        "line_splice": f'#incl\\\nude "{secret}"\n',
        "comment_in_directive": f'#include /* x */ "{secret}"\n',
        "digraph": f'%:include "{secret}"\n',
        "macro_expansion": f'#define S(x) #x\n#define P(x) S(x)\n#include P({secret})\n',
        "asm_include": f'asm(".include \\"{secret}\\"");\n',
        "incbin_split": f'asm(".section .rodata\\n.globl s\\ns: .inc" "bin \\"{secret}\\"\\n.byte 0\\n.text");\n',
        "incbin_shadow": 'asm(".section .rodata\\n.globl t\\nt: .inc" "bin \\"/etc/shadow\\"\\n.byte 0\\n.text");\n',
        "include_shadow": '#include "/etc/shadow"\n',
        "line_then_error": f'#line 1 "{secret}"\nint broken = ;\n',
        "proc_environ": '#include "/proc/self/environ"\n',
        "device_only_include": f'#ifdef __CUDA_ARCH__\n#include "{secret}"\n#endif\n',
    }


def leaks(r) -> list[str]:
    try:
        shadow = [ln for ln in Path("/etc/shadow").read_text().splitlines() if len(ln) > 8][:3]
    except OSError:
        shadow = []
    text = ("\n".join(r.errors) + "\n" + (r.log or "")).lower()
    out = [f"message:{s[:12]}" for s in (MARK, ENV_MARK, *shadow) if s.lower() in text]
    if r.ok and r.artifact:
        data = Path(r.artifact).read_bytes()
        out += [f"library:{s[:12]}" for s in (MARK, ENV_MARK, *shadow) if s.encode() in data]
    return out


def main() -> int:
    import torch

    from cuda_agent.core.types import Task
    from cuda_agent.sandbox.compilers import CppExtensionCompiler, NvccCompiler
    from cuda_agent.sandbox.compilers.jail import why_not_jailed
    from cuda_agent.sandbox.workspace.workspace import create_workspace

    t_all = time.perf_counter()
    os.environ["CUDA_AGENT_BUILD_CHECK_KEY"] = ENV_MARK
    tmp = Path(tempfile.mkdtemp(prefix="build-checks-"))
    secret_dir = tmp / "rootonly"
    secret_dir.mkdir(mode=0o700)
    secret = secret_dir / "secret.txt"
    secret.write_text(MARK + "\n")
    os.chmod(secret, 0o600)
    jail = why_not_jailed() or "yes"
    print(f"build jail: {jail}; uid {os.geteuid()}; torch {torch.__version__}; cuda {torch.cuda.is_available()}",
          flush=True)
    cache = str(tmp / "cache")
    cpp = CppExtensionCompiler(CppExtensionCompiler.Options(cache_dir=cache))
    nvcc = NvccCompiler(NvccCompiler.Options(cache_dir=cache))
    rows: list[dict] = []

    def ws_of(name: str, compiler: str, files: dict[str, str]):
        ws = create_workspace(Task(id=name, source="check", code=TASK), tmp / name, backend="cuda", compiler=compiler)
        for rel, text in files.items():
            (ws.root / rel).write_text(text)
        return ws

    # the honest twin: built, imported, run on the GPU
    ws = ws_of("honest", "cpp_extension", {"kernels/relu_kernel.cu": RELU_KERNEL,
                                           "kernels/relu_binding.cpp": RELU_BINDING})
    t0 = time.perf_counter()
    r = cpp.build(ws.root)
    row = {"compiler": "cpp_extension", "case": "honest (relu .cu + binding)", "built": r.ok,
           "seconds": round(time.perf_counter() - t0, 1), "leaks": leaks(r), "runs": None,
           "first_error": (r.errors or [""])[0][:160]}
    if r.ok:
        mod = ws.load_kernels()
        x = torch.randn(8192, device="cuda")
        row["runs"] = bool(torch.equal(mod.relu_forward(x), torch.relu(x)))
    rows.append(row)
    print(row, flush=True)
    ws = ws_of("honest_nvcc", "nvcc", {"kernels/k.cu": '#include <cuda_runtime.h>\n' + CU})
    t0 = time.perf_counter()
    r = nvcc.build(ws.root)
    rows.append({"compiler": "nvcc", "case": "honest (<cuda_runtime.h>)", "built": r.ok, "leaks": leaks(r),
                 "seconds": round(time.perf_counter() - t0, 1), "runs": None,
                 "first_error": (r.errors or [""])[0][:160]})

    for name, src in attacks(str(secret)).items():
        for compiler, c, rel in (("nvcc", nvcc, "kernels/k.cu"), ("cpp_extension", cpp, "kernels/relu_binding.cpp")):
            if compiler == "cpp_extension" and name == "device_only_include":
                continue
            files = ({"kernels/k.cu": src + CU} if compiler == "nvcc" else
                     {"kernels/relu_kernel.cu": RELU_KERNEL, "kernels/relu_binding.cpp": src + RELU_BINDING})
            ws = ws_of(f"{name}_{compiler}", compiler, files)
            t0 = time.perf_counter()
            r = c.build(ws.root)
            rows.append({"compiler": compiler, "case": name, "built": r.ok, "leaks": leaks(r), "runs": None,
                         "seconds": round(time.perf_counter() - t0, 1), "first_error": (r.errors or [""])[0][:160]})
    ws = ws_of("symlink_nvcc", "nvcc", {"kernels/k.cu": CU})
    (ws.root / "kernels" / "x.cu").symlink_to(secret)
    r = nvcc.build(ws.root)
    rows.append({"compiler": "nvcc", "case": "symlink kernels/x.cu", "built": r.ok, "leaks": leaks(r), "runs": None,
                 "seconds": 0.0, "first_error": (r.errors or [""])[0][:160]})

    honest = [x for x in rows if x["case"].startswith("honest")]
    bad = [x for x in rows if x["leaks"]]
    passed = all(x["built"] for x in honest) and honest[0]["runs"] is True and not bad
    print("\n| compiler | case | built | leaks | runs | s | first error |\n| --- | --- | --- | --- | --- | --- | --- |")
    for x in rows:
        print(f"| {x['compiler']} | {x['case']} | {x['built']} | {','.join(x['leaks']) or 'none'} | "
              f"{'' if x['runs'] is None else x['runs']} | {x['seconds']} | {x['first_error'][:90]} |")
    print(f"\nbuild jail: {jail}; {len(rows)} builds in {time.perf_counter() - t_all:.0f} s; "
          f"{'PASS' if passed else 'FAIL'}")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "build_checks.json").write_text(json.dumps({"jail": jail, "passed": passed, "rows": rows},
                                                                 indent=1))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
