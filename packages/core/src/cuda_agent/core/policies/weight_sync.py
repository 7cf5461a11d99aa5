"""Weight sync from the trainer into vLLM engines and servers.

The trainer writes one version of the policy weights to a safetensors file in a folder the
engines can read (``write_weights``); every vLLM worker then loads that file into its model
through :class:`WeightSyncExtension`, the class vLLM mixes into its workers when started
with ``worker_extension_cls`` (engine argument) or ``--worker-extension-cls`` (server). The
trainer calls the extension's method by name: ``LLM.collective_rpc`` in process, or
``POST /collective_rpc`` on a server started with ``VLLM_SERVER_DEV_MODE=1``. Only a file
path travels through the RPC, so the same path works for one engine in process and for
several servers on the host or on a shared file system.

torch and safetensors are imported when used.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

EXTENSION = "cuda_agent.core.policies.weight_sync.WeightSyncExtension"
LOAD_METHOD = "cuda_agent_load_weights"
PREFIX = "weights-"
KEEP_VERSIONS = 2  # the version being loaded and the one before stay on disk


def write_weights(named_tensors: Iterable[tuple[str, Any]], directory: str | Path, version: int) -> Path:
    """Write ``named_tensors`` as ``<directory>/weights-<version>.safetensors`` (atomically)
    and delete older versions beyond the last ``KEEP_VERSIONS``; returns the file."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in named_tensors:
        # a copy per name: tied weights share storage, which safetensors refuses to save
        # (moving a GPU tensor to the CPU copies it already; only a CPU tensor needs the clone)
        c = t.detach().to("cpu").contiguous()
        tensors[name] = c.clone() if c.data_ptr() == t.data_ptr() else c
    if not tensors:
        raise ValueError("no weights to write")
    path = directory / f"{PREFIX}{version:06d}.safetensors"
    tmp = directory / f".{path.name}.tmp-{os.getpid()}"
    save_file(tensors, str(tmp), metadata={"version": str(version)})
    os.replace(tmp, path)
    for old in sorted(directory.glob(f"{PREFIX}*.safetensors"))[:-KEEP_VERSIONS]:
        try:
            old.unlink()
        except OSError:
            pass
    return path


def read_weights(path: str | Path, device: Any = "cpu") -> Iterator[tuple[str, Any]]:
    """The tensors of a file written by :func:`write_weights`, one at a time, on ``device``."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device=str(device)) as f:
        for name in f.keys():
            yield name, f.get_tensor(name)


class WeightSyncExtension:
    """Methods added to every vLLM worker. A vLLM worker's ``reload_weights`` loads ``(name,
    tensor)`` pairs with Hugging Face names in place and then redoes the processing vLLM
    applied after the first load (the CPU backend, for one, repacks linear weights, so a
    plain ``model.load_weights`` into the processed parameters fails). Without it (older
    vLLM, the HF token server) the model's own ``load_weights`` takes the pairs."""

    def cuda_agent_load_weights(self, path: str) -> int:
        model = self.model_runner.model
        try:
            device = next(model.parameters()).device
        except StopIteration:  # pragma: no cover - a model without parameters
            device = "cpu"
        count = 0

        def weights() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for name, tensor in read_weights(path, device):
                count += 1
                yield name, tensor

        reload = getattr(self, "reload_weights", None)
        if callable(reload):
            reload(weights_iterator=weights(), is_checkpoint_format=True)
        else:
            model.load_weights(weights=weights())
        return count
