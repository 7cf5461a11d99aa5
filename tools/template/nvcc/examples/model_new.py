import torch
import torch.nn as nn

from cuda_agent_runtime import load_kernels

kernels = load_kernels()


class ModelNew(nn.Module):
    def __init__(self, alpha: float, beta: float):  # same signature as Model
        super().__init__()
        self.alpha = alpha
        self.beta = beta

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a = a.contiguous()
        b = b.contiguous()
        out = torch.empty_like(a)  # tensor creation is allowed
        err = kernels.launch_axpby(a, b, out, self.alpha, self.beta, a.numel())
        if err != 0:
            raise RuntimeError(f"launch_axpby failed with CUDA error {err}")
        return out
