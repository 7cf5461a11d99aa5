"""cuda-agent sandbox."""

__version__ = "0.1.0"
