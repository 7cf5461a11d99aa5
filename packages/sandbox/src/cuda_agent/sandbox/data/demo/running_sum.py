import torch
import torch.nn as nn


class Model(nn.Module):
    """Running sum along the last dimension, written as a product with an upper-triangular
    matrix of ones: out[:, j] = x[:, 0] + x[:, 1] + ... + x[:, j].

    The product costs n multiply-adds per output element (n = 512), and torch.compile keeps
    it a matrix product; a scan needs one add per element.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        upper = torch.ones(n, n, dtype=x.dtype, device=x.device).triu()
        return x @ upper


def get_inputs():
    return [torch.randn(512, 512)]


def get_init_inputs():
    return []
