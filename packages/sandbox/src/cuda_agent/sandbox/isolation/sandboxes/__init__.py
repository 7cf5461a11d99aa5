"""Sandbox plugins: ``local`` (default) and ``docker``."""

from .results import CommandResult, SandboxError
from .docker import DockerSandbox
from .local import LocalSandbox

__all__ = ["CommandResult", "DockerSandbox", "LocalSandbox", "SandboxError"]
