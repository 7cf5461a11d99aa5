"""cuda-agent evaluation."""

__version__ = "0.1.0"
