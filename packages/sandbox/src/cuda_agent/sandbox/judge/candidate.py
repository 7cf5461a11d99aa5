"""The candidate process: the only process a candidate's code ever runs in.

``python -m cuda_agent.sandbox.judge.candidate FD`` is started by the trusted side of a job
(:mod:`.client`) as root, imports torch and the harness and makes its CUDA context, then
waits. On ``drop`` it becomes the job's own user (:mod:`..isolation.privdrop`), and only then imports
the candidate. It answers the trusted side's commands over the socket ``FD``
(:mod:`.wire`, JSON only):

* ``load``: import the reference (for its weights and inputs) and the candidate, build both
  models after the same seed, load ``Model``'s state_dict into ``ModelNew``;
* ``run``: draw one input set from a seed, run ``ModelNew`` on it (run-time guard and
  poisoned memory on), hand the output back (:mod:`.tensors`);
* ``warm`` / ``loop`` / ``outputs``: time the candidate with a profiler plugin in two halves
  (warm-up, then ``n`` calls in the compiled loop with inputs rotated by :mod:`.rotation`
  and a checksum of every call's output), and hand back the last outputs;
* ``integrity``: what the candidate replaced of the harness (defence in depth);
* ``prebuild``: import the candidate only, so that its extensions are built (a CPU build
  job ahead of the GPU job, :mod:`.prebuild`);
* ``exit``.

The commands live in :mod:`.candidate_load`, :mod:`.candidate_run` and
:mod:`.candidate_timing` (what they share in :mod:`.candidate_state`); this module is the
entry point and the loop that serves them.

Nothing this process reports is believed by itself: the trusted side draws the same inputs,
runs the reference, compares every output, checks sampled checksums of timed calls and
bounds the reported times by its own wall clock. The guard and the integrity check here
only add refusals.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from typing import Any, Callable

from . import wire
from .candidate_state import CandidateState, die_with_parent, error_reply, release


# command name -> handler, filled by :func:`main` (from :func:`commands`)
_COMMANDS: dict[str, Callable[..., Any]] = {}


def commands() -> dict[str, Callable[..., Any]]:
    """Command name -> handler (the handlers' modules imported here: part of the harness
    that is loaded before any candidate code)."""
    from .candidate_load import do_drop, do_integrity, do_load, do_prebuild, do_reseed
    from .candidate_run import do_run
    from .candidate_timing import do_loop, do_outputs, do_warm, do_whole

    return {"drop": do_drop, "load": do_load, "reseed": do_reseed, "run": do_run, "warm": do_warm, "loop": do_loop,
            "whole": do_whole, "outputs": do_outputs, "integrity": do_integrity, "prebuild": do_prebuild}


def _next(sock: socket.socket) -> dict | None:
    """The trusted side's next command (descriptors sent with it closed), or None once it
    has closed the socket or broken the protocol."""
    try:
        msg, fds = wire.recv(sock)
    except wire.WireError:
        return None
    for fd in fds:
        os.close(fd)
    return msg


def serve(sock: socket.socket, st: CandidateState) -> int:
    while True:
        msg = _next(sock)
        if msg is None:
            return 0
        op = msg.get("op")
        if op == "exit":
            return 0
        release(st)  # the trusted side has copied what it was sent last
        st.ways = msg.get("ipc", True)
        fn = _COMMANDS.get(op)
        out_fds: list[int] = []
        try:
            if fn is None:
                reply: dict = {"ok": False, "error": {"type": "ValueError", "message": f"unknown command {op!r}"}}
            else:
                res = fn(st, msg)
                reply, out_fds = res if isinstance(res, tuple) else (res, [])
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            reply = {"ok": False, "error": error_reply(exc), "traceback": traceback.format_exc(limit=8)[-3000:]}
        wire.send(sock, reply, out_fds)


def import_harness() -> None:
    """Every module of the judge package and the rest the handlers import inside functions,
    before candidate code runs: a module first imported later would be missing from the
    integrity snapshot, and could be unreadable once the process has given up its rights."""
    import importlib
    import pkgutil

    from .. import judge

    for info in pkgutil.walk_packages(judge.__path__, judge.__name__ + "."):
        if not info.name.endswith((".candidate", ".attacks")):
            importlib.import_module(info.name)
    for name in ("cuda_agent.sandbox.isolation.hostlock", "cuda_agent.sandbox.isolation.privdrop",
                 "cuda_agent.sandbox.executors.job", "cuda_agent.core.errors", "cuda_agent.core.plugins",
                 "cuda_agent.core.types"):
        importlib.import_module(name)
    try:  # the plugins a profiler lookup loads, which import modules of every package
        from cuda_agent.core.plugins import get_plugin_manager

        get_plugin_manager().all_components()
    except Exception:  # noqa: BLE001 - no plugins here: the built-in profilers are used
        pass


def settle_torch() -> None:
    """Import now what the integrity snapshot would import first (torch._dynamo, seconds of
    import that rebind torch functions): paid while the process waits for its job, not in
    the job's load."""
    import importlib

    from . import integrity

    for name in integrity.SETTLE_FIRST:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a torch without it: the snapshot does without too
            pass


def main(argv: list[str] | None = None) -> int:
    import json

    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(argv[0])
    os.environ["CUDA_AGENT_JOB_PROCESS"] = str(os.getpid())  # this process may give up its rights
    die_with_parent()
    sock = socket.socket(fileno=int(cfg["fd"]))
    st = CandidateState()
    st.device = cfg.get("device", "cpu")
    ready: dict[str, Any] = {"op": "ready", "pid": os.getpid()}
    cuda_step = False  # failing while the CUDA context is made (not a harness import naming cuda_agent)
    try:
        import torch

        # the harness, before any candidate code (so that the integrity snapshot covers it):
        # the command handlers and what they import, then the rest the trusted side relies on
        _COMMANDS.update(commands())
        import_harness()
        from . import comparison, draws, inputs, integrity, loading, options, poisoning, verify, watchdog  # noqa: F401
        from .profilers import cuda_events, wallclock  # noqa: F401
        from . import native, rotation, tensors  # noqa: F401

        settle_torch()
        native.timing()
        if cfg.get("standby"):  # forked ahead, imports done: the CUDA context waits for a job
            msg = _next(sock)
            if msg is None or msg.get("op") != "start":
                return 0
        dev = torch.device(st.device)
        if dev.type == "cuda":
            from ..isolation.hostlock import device_quiet

            cuda_step = True
            # the context is made while no timing runs on this GPU (the worker's device quiet
            # lock, named in the environment this process inherits); the imports above are not
            with device_quiet():
                torch.cuda.set_device(dev.index if dev.index is not None else 0)
                torch.zeros(1, device=dev)
                native.timing_for_cuda()
    except Exception as exc:  # noqa: BLE001 - reported to the trusted side
        ready = {"op": "failed", "error": {**error_reply(exc), "cuda_init": cuda_step}}
    wire.send(sock, ready)
    if ready["op"] != "ready":
        return 1
    return serve(sock, st)


if __name__ == "__main__":
    sys.exit(main())
