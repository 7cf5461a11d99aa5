"""Running a task's ``model.py`` once, before an agent spends an episode on it.

:func:`check_model` imports the module, finds ``Model``, ``get_inputs`` and
``get_init_inputs``, calls ``get_init_inputs()``, builds ``Model(*init_inputs)``, calls
``get_inputs()`` and runs one forward pass on the device. The first step that fails is a
one-line :class:`~cuda_agent.core.errors.TaskError` naming the step, the error and the line
of ``model.py`` it came from (an import that fails says so; it is not "missing Model").

This is running task code, so it never runs in the caller's process: a child process
(``python -m cuda_agent.sandbox.workspace.modelcheck``) imports torch, then gives up its rights the
way executor jobs do (:func:`cuda_agent.sandbox.isolation.privdrop.drop_privileges`: an unprivileged
user, no network, a private temporary folder) before it reads ``model.py``, from a copy in a
folder of its own. The child reports through a pipe, as one JSON object.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from cuda_agent.core.errors import TaskError

TIMEOUT_S = 300.0  # the first CUDA context and a large model's first forward pass fit in this
NAMES = ("Model", "get_inputs", "get_init_inputs")
STEP_LABELS = {
    "import": "import failed",
    "names": "missing names",
    "get_init_inputs": "get_init_inputs() failed",
    "Model": "Model(*get_init_inputs()) failed",
    "get_inputs": "get_inputs() failed",
    "forward": "the forward pass failed",
}


def check_model(model_path: str | Path, device: str = "cpu", timeout: float = TIMEOUT_S) -> dict:
    """Run ``model_path`` once in a child process; a one-line TaskError if any step fails.

    Returns what the child reported (``seconds``, ``privileges``)."""
    model_path = Path(model_path)
    if not model_path.is_file():
        raise TaskError(f"{model_path}: no such file")
    folder = Path(tempfile.mkdtemp(prefix="cuda-agent-modelcheck-"))
    read, write = os.pipe()
    try:
        os.chmod(folder, 0o755)  # the child's user reads the copy, and nothing else of ours
        shutil.copyfile(model_path, folder / "model.py")
        os.chmod(folder / "model.py", 0o644)
        cmd = [sys.executable, "-m", "cuda_agent.sandbox.workspace.modelcheck", str(folder), device, str(write)]
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    pass_fds=(write,), start_new_session=True)
        finally:
            os.close(write)
            write = -1
        with os.fdopen(read, "rb") as pipe:
            read = -1
            report, stderr = _wait(proc, pipe, timeout, model_path)
    finally:
        for fd in (read, write):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
    if report is None:
        tail = [ln for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
        raise TaskError(f"{model_path}: running it once failed: the check process exited with status "
                        f"{proc.returncode}" + (f" ({tail[-1][:300]})" if tail else ""))
    if not report.get("ok"):
        where = f" (line {report['line']})" if report.get("line") else ""
        label = STEP_LABELS.get(report.get("step"), str(report.get("step")))
        raise TaskError(f"{model_path}: {label}: {report.get('error', '')}{where}")
    return report


def _wait(proc: subprocess.Popen, pipe: Any, timeout: float, model_path: Path) -> tuple[dict | None, bytes]:
    try:
        stderr = proc.communicate(timeout=timeout)[1] or b""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise TaskError(f"{model_path}: running Model once did not finish within {timeout:g} s") from None
    data = pipe.read()
    try:
        return json.loads(data.decode()), stderr
    except (ValueError, UnicodeDecodeError):
        return None, stderr


# --- the child ------------------------------------------------------------------------------


def _line_in(exc: BaseException, filename: str) -> int | None:
    """The last line of ``filename`` in the traceback of ``exc`` (or of a SyntaxError)."""
    if isinstance(exc, SyntaxError) and exc.lineno and os.path.basename(exc.filename or "") == filename:
        return exc.lineno
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.basename(frame.filename) == filename:
            line = frame.lineno
    return line


def _error(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text[:400]


def _to(value: Any, device: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def run_steps(folder: str, device: str) -> dict:
    """Import ``folder/model.py`` and run it once; the report of the first failing step."""
    import importlib.util

    import torch

    t0 = time.monotonic()
    step = "import"
    try:
        spec = importlib.util.spec_from_file_location("model", os.path.join(folder, "model.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["model"] = module
        spec.loader.exec_module(module)
        missing = [n for n in NAMES if not callable(getattr(module, n, None))]
        if missing:
            return {"ok": False, "step": "names", "error": f"{', '.join(missing)} not defined after import "
                    "(KernelBench format needs Model, get_inputs, get_init_inputs)"}
        step = "get_init_inputs"
        init = module.get_init_inputs()
        if not isinstance(init, (list, tuple)):
            raise TypeError(f"get_init_inputs() must return a list, got {type(init).__name__}")
        step = "Model"
        model = module.Model(*init)
        step = "get_inputs"
        inputs = module.get_inputs()
        if not isinstance(inputs, (list, tuple)):
            raise TypeError(f"get_inputs() must return a list, got {type(inputs).__name__}")
        step = "forward"
        if hasattr(model, "to"):
            model = model.to(device)
        with torch.no_grad():
            model(*_to(list(inputs), device))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    except BaseException as exc:  # noqa: BLE001 - whatever the task code raises is the report
        return {"ok": False, "step": step, "error": _error(exc), "line": _line_in(exc, "model.py")}
    return {"ok": True, "seconds": round(time.monotonic() - t0, 3)}


def _child(folder: str, device: str, fd: int) -> None:
    from ..isolation import privdrop

    os.environ[privdrop.WORKER_ENV] = str(os.getpid())  # this process exists only to run the task's code
    import torch  # noqa: F401 - imported with our rights, before they are given up

    view, meta = privdrop.drop_privileges(folder)
    report = run_steps(str(view), device)
    report["privileges"] = meta.get("privileges", "")
    with os.fdopen(fd, "wb") as out:
        out.write(json.dumps(report).encode())


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
