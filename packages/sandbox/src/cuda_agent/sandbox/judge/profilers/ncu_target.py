"""Child process that ncu profiles: build the models and run the candidate's forward once."""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--candidate", default="model_new.py")
    ap.add_argument("--reference", default="model.py")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    import torch

    from ..inputs import draw_inputs
    from ..loading import build_models, load_candidate, load_reference, workspace_imports
    from ..watchdog import synchronize

    ws = Path(a.workspace)
    cand = Path(a.candidate) if Path(a.candidate).is_absolute() else ws / a.candidate
    ref = Path(a.reference) if Path(a.reference).is_absolute() else ws / a.reference
    with workspace_imports(ws), torch.no_grad():
        ref_mod = load_reference(ref)
        cand_mod, _ = load_candidate(cand)
        loaded = build_models(ref_mod, cand_mod, a.device, a.seed)
        inputs = draw_inputs(ref_mod.get_inputs, a.seed + 1, a.device).values
        loaded.cand_model(*inputs)
        synchronize(a.device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
