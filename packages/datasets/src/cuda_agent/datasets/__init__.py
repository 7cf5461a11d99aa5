"""cuda-agent datasets."""

__version__ = "0.1.0"
