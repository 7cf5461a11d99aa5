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
        return kernels.axpby_forward(a, b, self.alpha, self.beta)
