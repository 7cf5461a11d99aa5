"""Environments the trainer rolls out in (``trainer.environment``), registered through the
``register_environments`` hook like any plugin's: ``toy`` (a guessing game for CPU tests)
and ``cuda`` (the CUDA workspace of cuda-agent-sandbox)."""

from __future__ import annotations
