"""Sandbox plugins: ``local`` (default) and ``docker``."""

from .common import CommandResult, SandboxError
from .docker import DockerSandbox
from .local import LocalSandbox

__all__ = ["CommandResult", "DockerSandbox", "LocalSandbox", "SandboxError"]
