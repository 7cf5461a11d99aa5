"""Task sources shared by the datasets tests."""

GOOD = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.lin(x))


def get_inputs():
    return [torch.rand(4, 8)]


def get_init_inputs():
    return [8]
'''


def model_code(init: str, forward: str, inputs: str = "[torch.rand(4, 16)]", init_inputs: str = "[]", extra: str = "") -> str:
    """A KernelBench-style file with the given __init__ body, forward body and inputs."""
    return f'''import torch
import torch.nn as nn
import torch.nn.functional as F
{extra}

class Model(nn.Module):
    def __init__(self, *args):
        super().__init__()
        {init}

    def forward(self, x):
        {forward}


def get_inputs():
    return {inputs}


def get_init_inputs():
    return {init_inputs}
'''
