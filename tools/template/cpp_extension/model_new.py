# Your solution. Keep the constructor signature and parameter names of Model (model.py).
# Only tensor creation (torch.empty, torch.empty_like, ...) and your own kernels may run
# in forward: no torch operators, no torch.nn.functional. See SKILL.md and examples/.
import torch
import torch.nn as nn

from cuda_agent_runtime import load_kernels

kernels = load_kernels()  # the module built from kernels/ by `python tools/compile.py`


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):  # replace with Model's exact signature
        super().__init__()
        raise NotImplementedError("write ModelNew: see SKILL.md and examples/")

    def forward(self, *inputs):
        raise NotImplementedError
