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


def workspace_ran_out(output: str, workspace_full: bool, scratch_full: list | None) -> bool:
    """Whether the workspace's file system is the one a command ran out of: it is (almost)
    full, or the command hit "No space left on device" while no scratch file system is full
    (``scratch_full``: those that are; None when unknown) — a preallocation larger than the
    room left fails without filling it."""
    return workspace_full or ("No space left on device" in output and scratch_full is not None and not scratch_full)


def hit_process_limit(output: str) -> bool:
    """Whether a command's output says a process could not be started for the process limit."""
    return "fork: " in output and "Resource temporarily unavailable" in output


def command_end_messages(stopped: int, output: str, process_limit: int | None, held_by_jobs: int,
                         full: list[tuple[str, int]]) -> list[str]:
    """The lines a sandbox appends after a command of the agent's persistent shell:
    ``stopped`` processes the command left running; the process limit when the output says
    it was hit (``held_by_jobs``: processes of the session's background jobs); ``full``:
    (path, size in MB) of each full scratch file system."""
    msgs = []
    if stopped:
        msgs.append(f"[sandbox] the command left {stopped} processes running; they were stopped (a command's "
                    "processes end with it: start long-running work as a background job, run_in_background)")
    if process_limit is not None and hit_process_limit(output):
        held = (f"; the session's background jobs hold {held_by_jobs} of them (kill_job ends one)"
                if held_by_jobs else "")
        msgs.append(f"[sandbox] the process limit was reached: the sandbox runs at most {process_limit} processes"
                    f"{held}")
    for path, size in full:
        msgs.append(f"[sandbox] {path} is full: it holds at most {size} MB; delete files there to go on")
    return msgs
