"""``cuda-agent executor check``: prove on this machine that the configured executor pool
survives misbehaving jobs (crash, abort, hang, exception; CUDA errors and out-of-memory
on GPUs) and keeps serving, and show how long a job and a worker replacement take."""

from __future__ import annotations

import time

import click

from cuda_agent.core.configreads import command_reads

READS = command_reads("executor check", "executor", "backend")


def probes(backend: str, hang_timeout: float) -> list[tuple[str, str, dict, float | None, str]]:
    rows = [
        ("ok", "echo", {}, None, "ok"),
        ("exception", "fail", {}, None, "exception"),
        ("segfault", "segfault", {}, None, "crash"),
        ("abort", "abort", {}, None, "crash"),
        ("hang", "hang", {}, hang_timeout, "timeout"),
    ]
    if backend == "cuda":
        rows += [
            ("CUDA ok", "cuda_ok", {}, None, "ok"),
            ("illegal memory access", "cuda_illegal_access", {}, None, "cuda_error"),
            ("device-side assert", "cuda_device_assert", {}, None, "cuda_error"),
            ("out of GPU memory", "cuda_oom", {}, None, "oom"),
            ("kernel never ends", "cuda_hang", {}, hang_timeout, "timeout"),
        ]
    return rows


def register_executor_commands(cli) -> None:
    @cli.group("executor")
    def group() -> None:
        """Executor pools (GPU/CPU job workers)."""

    @group.command("check", context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1)
    @click.option("--hang-timeout", default=5.0, show_default=True, help="Timeout of the hanging probes (s).")
    def check_cmd(args: tuple[str, ...], hang_timeout: float) -> None:
        """Run misbehaving probe jobs on the configured executor (CONFIG files, key=value overrides:
        executor.* and the run's backend, which the executor runs its jobs on)."""
        from cuda_agent.core.cli import split_args
        from cuda_agent.core.config import compose

        from .configured import make_executor
        from .job import Job, JobError

        files, overrides = split_args(args)
        cfg = compose(files, overrides, reads=READS)
        ex = make_executor(cfg)
        backend = getattr(ex, "backend", "cpu")
        S = "cuda_agent.sandbox.executors.selftest:"
        rows = []
        failed = 0
        try:
            t0 = time.monotonic()
            ex.start()
            ex.run(Job(S + "echo"))
            click.echo(f"executor {ex.name} on {','.join(ex.devices)}: first job after {time.monotonic() - t0:.1f} s")
            for name, fn, kw, timeout, want in probes(backend, hang_timeout):
                t = time.monotonic()
                try:
                    ex.run(Job(S + fn, kw, timeout=timeout))
                    got, msg = "ok", ""
                except JobError as exc:
                    got, msg = exc.reason, str(exc)
                job_s = time.monotonic() - t
                t = time.monotonic()
                try:
                    ex.run(Job(S + "echo"))
                    after = "ok"
                except JobError as exc:
                    after = f"failed: {exc}"
                ok = got == want and after == "ok"
                failed += not ok
                rows.append((name, want, got, f"{job_s:.2f}", after, f"{time.monotonic() - t:.2f}",
                             "PASS" if ok else "FAIL", msg[:60]))
        finally:
            ex.close()
        head = ("probe", "expected", "got", "job_s", "next_job", "next_s", "result", "message")
        widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
        for r in [head, tuple("-" * w for w in widths), *rows]:
            click.echo("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
        if failed:
            raise click.ClickException(f"{failed} probe(s) failed")
