"""The reference a baseline times: its code imported from the cache folder, the model
built from its seeded init inputs, and the input sets drawn on the device to rotate through
while timing (as many as fit a memory budget unless a number is asked for).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable

from ..inputs import draw_inputs, nbytes


def auto_input_sets(one_set_bytes: int, device: Any, wanted: int = 0) -> int:
    """How many input sets to rotate through: ``wanted``, or as many sets of
    ``one_set_bytes`` (what a set costs while timed) as fit a budget (1..4): a quarter of
    the device's free memory, 512 MB on the CPU."""
    if wanted > 0:
        return wanted
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        budget = free // 4
    else:
        budget = 512 << 20
    if one_set_bytes <= 0:
        return 4
    return int(max(1, min(4, budget // one_set_bytes)))


def rotation_sets(get_inputs: Callable, device: Any, seed: int, wanted: int = 0) -> list[list]:
    """Input sets to rotate through while timing, each drawn with its own seed."""
    first = draw_inputs(get_inputs, seed + 7, device).values
    k = auto_input_sets(nbytes(first), device, wanted)
    return [first] + [draw_inputs(get_inputs, seed + 7 * (i + 2), device).values for i in range(k - 1)]


def load_code(model_code: str, cache_dir: Path) -> Any:
    """The reference's module, imported from a file named by its code's hash under ``cache_dir/src``."""
    from ..verify import load_module

    src_dir = cache_dir / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    path = src_dir / f"{hashlib.sha256(model_code.encode()).hexdigest()[:20]}.py"
    if not path.exists():
        path.write_text(model_code)
    return load_module(path, "_cuda_agent_baseline")


def build_reference(ref_mod: Any, device: Any, seed: int) -> tuple[Any, list]:
    import torch

    from ..inputs import seed_everything

    seed_everything(seed)
    init = ref_mod.get_init_inputs()
    init = list(init) if isinstance(init, (list, tuple)) else [init]
    with torch.device(torch.device(device)):
        model = ref_mod.Model(*init)
    return model.to(torch.device(device)), init
