"""Agent shell tools: ``bash`` (a persistent shell; optionally a background job),
``bash_output`` (read a background job's new output) and ``kill_job``."""

from __future__ import annotations

import base64
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..interfaces import AgentTool
from .base import ToolContext, ToolError, fail, function_schema, ok

SHELL_KEY = "shell.session"
JOBS_KEY = "shell.jobs"


class _Reader:
    """Drains a process's stdout into a buffer on a thread."""

    def __init__(self, proc: Any):
        self.proc = proc
        self.buf = bytearray()
        self.eof = False
        self.cond = threading.Condition()
        self.read_pos = 0  # for incremental reads of background jobs
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _read_chunk(self) -> bytes:
        out = self.proc.stdout
        try:
            fd = out.fileno()
        except (AttributeError, OSError, ValueError):
            fd = None
        if fd is not None:
            return os.read(fd, 65536)
        reader = getattr(out, "read1", None) or out.read
        return reader(65536)

    def _run(self) -> None:
        while True:
            try:
                chunk = self._read_chunk()
            except (OSError, ValueError):
                chunk = b""
            with self.cond:
                if not chunk:
                    self.eof = True
                    self.cond.notify_all()
                    return
                self.buf.extend(chunk)
                self.cond.notify_all()


def _decode(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


class ShellSession:
    """A long-lived ``bash`` whose state (cwd, variables) persists between commands.

    Each command is sent base64-encoded and ``eval``-ed inside a group whose stdin is
    ``/dev/null``, followed by a unique end marker carrying the exit status, so a syntax
    error or an unterminated quote cannot derail the session. A command that outlives its
    timeout kills the shell; the next command starts a fresh one. After each command the
    sandbox's process handle may end what the command left running and say so
    (``end_command(output)``); a shell whose output ends is killed, never left running.
    """

    def __init__(self, ctx: ToolContext):
        self.ctx = ctx
        self.proc = ctx.start_process(["bash", "--noprofile", "--norc"])
        self.reader = _Reader(self.proc)
        self.marker = f"__CUDA_AGENT_END_{uuid.uuid4().hex}__"

    def alive(self) -> bool:
        return self.proc.poll() is None and not self.reader.eof

    def run(self, command: str, timeout: float) -> tuple[str, int | None, bool]:
        """Run ``command``; returns (output, exit status or None, timed_out)."""
        encoded = base64.b64encode(command.encode()).decode()
        script = (
            f"{{ eval \"$(printf '%s' {encoded} | base64 -d)\"\n}} </dev/null 2>&1\n"
            f"printf '\\n{self.marker}%d\\n' $?\n"
        )
        with self.reader.cond:
            start = len(self.reader.buf)
        try:
            self.proc.stdin.write(script.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return "the shell is gone; a new one starts with your next command", None, False
        needle = self.marker.encode()
        deadline = time.monotonic() + timeout
        ended = timed_out = False
        status = None
        with self.reader.cond:
            while True:
                pos = self.reader.buf.find(needle, start)
                if pos >= 0:
                    end = self.reader.buf.find(b"\n", pos)
                    if end >= 0:
                        status_text = self.reader.buf[pos + len(needle) : end]
                        out = bytes(self.reader.buf[start:pos])
                        del self.reader.buf[: end + 1]
                        out = out.rstrip(b"\n")
                        try:
                            status = int(status_text)
                        except ValueError:
                            status = None
                        break
                if self.reader.eof:
                    out = bytes(self.reader.buf[start:])
                    ended = True
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    out = bytes(self.reader.buf[start:])
                    timed_out = True
                    break
                self.reader.cond.wait(min(left, 1.0))
        if timed_out:
            self.close()
            return _decode(out), None, True
        if ended:
            self.close()  # whatever is left of it ends here
            return (self._noted(_decode(out))
                    + "\n(the shell exited; a new one starts with your next command)"), None, False
        return self._noted(self._ended(_decode(out))), status, False

    def _ended(self, out: str) -> str:
        """``out`` with what the sandbox did to the processes the command left, if the process
        handle ends them (``end_command(output)``)."""
        end = getattr(self.proc, "end_command", None)
        if not callable(end):
            return out
        try:
            extra = end(out)
        except Exception:
            return out
        return f"{out.rstrip(chr(10))}\n{extra}" if extra else out

    def _noted(self, out: str) -> str:
        """``out`` with what a sandbox limit did to the command (disk full, ...), if the
        process handle says (``limit_notes(output)``)."""
        notes = getattr(self.proc, "limit_notes", None)
        if not callable(notes):
            return out
        try:
            extra = notes(out)
        except Exception:
            return out
        return f"{out.rstrip(chr(10))}\n{extra}" if extra else out

    def close(self) -> None:
        try:
            self.proc.kill()
        except Exception:
            pass


class BackgroundJob:
    def __init__(self, ctx: ToolContext, job_id: str, command: str):
        self.id = job_id
        self.command = command
        self.started = time.time()
        self.proc = ctx.start_process(["bash", "--noprofile", "--norc", "-c", command])
        self.reader = _Reader(self.proc)
        self.killed = False

    def status(self) -> str:
        code = self.proc.poll()
        if self.killed:
            return "killed"
        if code is None:
            return "running"
        return f"exited with status {code}"

    def new_output(self) -> str:
        with self.reader.cond:
            data = bytes(self.reader.buf[self.reader.read_pos :])
            self.reader.read_pos = len(self.reader.buf)
        return _decode(data)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.killed = True
        self.proc.kill()


def _session(ctx: ToolContext) -> ShellSession:
    with ctx._lock:
        sess = ctx.state.get(SHELL_KEY)
        if sess is None or not sess.alive():
            sess = ShellSession(ctx)
            ctx.state[SHELL_KEY] = sess
            ctx.on_close(sess.close)
        return sess


def _jobs(ctx: ToolContext) -> dict[str, BackgroundJob]:
    return ctx.state.setdefault(JOBS_KEY, {})


@dataclass
class BashOptions:
    timeout: float = 300.0  # default seconds per command
    max_timeout: float = 600.0  # the most a call may ask for


class BashTool(AgentTool):
    name = "bash"
    description = "Run a command in a persistent bash shell in the workspace (or as a background job)."
    Options = BashOptions

    def schema(self) -> dict:
        return function_schema(
            self.name,
            "Run a bash command in a persistent shell whose working directory and variables persist "
            "between calls; stdout and stderr are returned together with the exit status. "
            "Use run_in_background for long commands, then bash_output to read them and kill_job to stop them.",
            {
                "command": {"type": "string", "description": "The command to run."},
                "timeout": {
                    "type": "number",
                    "description": f"Seconds before the command is killed (default {self.options.timeout:g}, "
                    f"at most {self.options.max_timeout:g}).",
                },
                "run_in_background": {
                    "type": "boolean",
                    "description": "Start the command as a background job and return its id at once.",
                },
            },
            ["command"],
        )

    def call(self, arguments: dict, context: ToolContext):
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("bash: 'command' must be a non-empty string")
        timeout = arguments.get("timeout") or self.options.timeout
        try:
            timeout = min(float(timeout), self.options.max_timeout)
        except (TypeError, ValueError):
            raise ToolError("bash: 'timeout' must be a number of seconds")
        if arguments.get("run_in_background"):
            jobs = _jobs(context)
            job_id = f"job{len(jobs) + 1}"
            job = BackgroundJob(context, job_id, command)
            jobs[job_id] = job
            context.on_close(job.kill)
            return ok(self.name, f"started background job {job_id} (pid {job.proc.pid}); "
                      f"read its output with bash_output(job_id='{job_id}')")
        out, status, timed_out = _session(context).run(command, timeout)
        if timed_out:
            return fail(self.name, f"{out}\n(timed out after {timeout:g} s; the command was killed and the shell restarted)")
        tail = "" if status in (0, None) else f"\n(exit status {status})"
        text = (out + tail) if (out or tail) else "(no output)"
        return ok(self.name, text) if status in (0, None) else fail(self.name, text)


_JOB_ID = {"job_id": {"type": "string", "description": "The id printed when the job started."}}


def _named_job(context: ToolContext, arguments: dict) -> BackgroundJob:
    """The background job ``arguments["job_id"]`` names; a ToolError naming the known ones."""
    job = _jobs(context).get(str(arguments.get("job_id", "")))
    if job is None:
        known = ", ".join(_jobs(context)) or "none"
        raise ToolError(f"no background job {arguments.get('job_id')!r} (jobs: {known})")
    return job


class BashOutputTool(AgentTool):
    name = "bash_output"
    description = "Read new output of a background job."

    def schema(self) -> dict:
        return function_schema(self.name, "Return the output a background job produced since the last read, and its "
                               "status.", _JOB_ID, ["job_id"])

    def call(self, arguments: dict, context: ToolContext):
        job = _named_job(context, arguments)
        time.sleep(0.05)
        out = job.new_output()
        return ok(self.name, f"[{job.id}: {job.status()}]\n{out}" if out else f"[{job.id}: {job.status()}] (no new output)")


class KillJobTool(AgentTool):
    name = "kill_job"
    description = "Kill a background job."

    def schema(self) -> dict:
        return function_schema(self.name, "Kill a running background job.", _JOB_ID, ["job_id"])

    def call(self, arguments: dict, context: ToolContext):
        job = _named_job(context, arguments)
        was = job.status()
        job.kill()
        return ok(self.name, f"{job.id} killed (was {was})")
