"""What a sandbox hands back: a command's result, the lines it appends to a command's
output when a limit stopped it, and the error raised when a sandbox cannot be opened or
used as configured."""

from __future__ import annotations

from dataclasses import dataclass

from cuda_agent.core.errors import CudaAgentError


class SandboxError(CudaAgentError):
    """A sandbox cannot be opened or used as configured."""


@dataclass
class CommandResult:
    exit_code: int | None
    output: str
    timed_out: bool = False
    seconds: float = 0.0


def limit_messages(timed_out: bool, timeout: float, killed_for_disk: bool, disk_mb: int, file_size_mb: int,
                   file_too_large: bool, out_of_memory: str | None, cpu_s: int | None = None,
                   disk_full: bool = False) -> list[str]:
    """The lines a sandbox appends to a command's output when a limit stopped it.
    ``out_of_memory``: the memory rule in words when the command was killed for memory;
    ``disk_full``: the workspace's size-limited file system has no room left."""
    msgs = []
    if timed_out:
        msgs.append(f"[sandbox] command timed out after {timeout:g} s; it and every process it started were killed")
    if killed_for_disk:
        msgs.append(f"[sandbox] the workspace grew past its disk limit of {disk_mb} MB (sparse files count at "
                    "their full size); the command was killed: delete large files")
    if disk_full and not killed_for_disk:
        msgs.append(f"[sandbox] the workspace is full: it holds at most {disk_mb} MB (preallocated space counts); "
                    "delete large files to go on")
    if file_too_large:
        msgs.append(f"[sandbox] file size limit exceeded: files may not exceed {file_size_mb} MB")
    if cpu_s is not None:
        msgs.append(f"[sandbox] CPU time limit of {cpu_s} s exceeded")
    if out_of_memory:
        msgs.append(f"[sandbox] killed: out of memory ({out_of_memory}) or another resource limit")
    return msgs
