"""One job's judge: the trusted process's view of a candidate under test.

A :class:`JudgeSession` holds, for one verification and/or profiling job:

* the snapshot of the files judged (:mod:`.snapshot`): the static checks, the reference
  and the candidate process all read it;
* the reference module, imported here (the trusted process);
* the candidate process (:mod:`.client`), the job's own user, with the candidate loaded.

Verification (:mod:`..verify`) and profiling (:mod:`..jobs`) drive it; one session serves
both when a job does both (one candidate process, one load of the candidate).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.core.types import FailureCategory

from . import snapshot, tensors
from .client import CandidateProcess, CandidateProcessError, obtain


@dataclass
class Refusal:
    """A candidate-side outcome that ends the job: its category and message."""

    category: FailureCategory
    message: str
    extra: dict = field(default_factory=dict)


def job_files(workspace: str | Path, candidate: str | Path, reference: str | Path) -> tuple[Path, Path, Path]:
    """The workspace and the two judged files, relative names taken inside the workspace."""
    ws = Path(workspace)
    cand, ref = Path(candidate), Path(reference)
    return ws, cand if cand.is_absolute() else ws / cand, ref if ref.is_absolute() else ws / ref


class JudgeSession:
    def __init__(self, workspace: str | Path, candidate: str | Path, reference: str | Path, device: str,
                 drop: bool = True, timeout: float | None = None):
        self.device = str(device)
        self.drop_enabled = drop
        self.timeout = timeout
        ws, cand, ref = Path(workspace), Path(candidate), Path(reference)
        self.source = ws
        cand_rel, ref_rel = _relative(cand, ws), _relative(ref, ws)
        self.meta: dict[str, Any] = {}
        if cand_rel is not None and ref_rel is not None:
            files, folders = snapshot.workspace_files(ws, cand_rel, ref_rel)
            self.snap = snapshot.take(ws, files, folders)
            self.candidate, self.reference = self.snap.path(cand_rel), self.snap.path(ref_rel)
        else:  # files outside one folder (a single-file solution beside a task folder)
            self.snap = snapshot.take(cand.parent, [cand.name])
            ref_snap = snapshot.take(ref.parent, [ref.name], parent=str(self.snap.root))
            self.candidate, self.reference = self.snap.path(cand.name), ref_snap.path(ref.name)
            self.snap.refused.update(ref_snap.refused)
        self.cand_name = cand.name
        self.proc: CandidateProcess | None = None
        self.loaded = False
        self.loaded_seed: int | None = None  # the seed the candidate's weights come from
        self.load_reply: dict = {}
        self.weights: str | None = None  # how ModelNew got Model's weights (the candidate process's report)
        self.native_findings: list[str] = []  # shared objects refused by their symbols (rule native.python-api)
        self.ipc = True

    # -- what the snapshot holds -------------------------------------------------------

    def refused_files(self) -> str:
        """A message naming the judged files that were not copied (links, special files)."""
        if not self.snap.refused:
            return ""
        rel, why = next(iter(self.snap.refused.items()))
        return f"{rel} was not read: {why} (rule judge.files: the judged files must be regular files in the workspace)"

    # -- the candidate process ------------------------------------------------------

    def start(self) -> CandidateProcess:
        if self.proc is None:
            from .checks import native_symbols

            prebuilt = self._prebuilt()
            self.native_findings = native_symbols.job_findings(self.snap.root, prebuilt and prebuilt["prebuilt"])
            if self.native_findings:  # nothing of it reaches the candidate process
                prebuilt = None
            self.proc = obtain(self.device)
            self.proc.wait_ready()
            self.meta.update(self.proc.drop(str(self.snap.root), self.drop_enabled, prebuilt=prebuilt))
            self.meta.update({f"job_{k}": v for k, v in self.proc.isolation.items()})
        return self.proc

    def _prebuilt(self) -> dict | None:
        """The extensions built ahead of this job for exactly the judged candidate on this
        device's architecture (:mod:`.prebuild`), for the candidate process; the metadata's
        ``prebuilt`` says whether they were found."""
        from . import prebuild

        state = self.source / ".cuda_agent" / prebuild.STATE
        if not state.exists():
            return None
        try:
            arch = prebuild.arch_for(self.device)
            key = prebuild.source_key(self.candidate.read_bytes(), arch)
        except Exception as exc:  # noqa: BLE001
            self.meta["prebuilt"] = f"unused: {exc}"[:300]
            return None
        folder, info, why = prebuild.workspace_build(self.source, key)
        if folder is None:
            self.meta["prebuilt"] = f"unused: {why}"
            return None
        self.meta["prebuilt"] = ("built ahead in {:.1f} s".format(float(info.get("seconds") or 0)) +
                                 ("" if info.get("imported") else f"; its import without a GPU failed, so the job "
                                  f"builds what is missing ({str(info.get('message') or '')[:300]})"))
        return {"prebuilt": str(folder), "arch": arch}

    def load(self, seed: int, strict_state_dict: bool, precision: str, weights: str = "state_dict") -> Refusal | None:
        """Import the reference and the candidate in the candidate process (``weights``: see
        :mod:`.rules`; the reply's ``weights`` says which protocol applied)."""
        if self.loaded:  # a job that verified first: the candidate's weights rebuilt for this seed
            return None if seed == self.loaded_seed else self.rebuild(seed, weights)
        proc = self.start()
        if self.native_findings:  # judged here before the candidate process loads any of it
            return Refusal(FailureCategory.FORBIDDEN_OP, self.native_findings[0], {"native": self.native_findings[:20]})
        reply = self._request({"op": "load", "workspace": str(self.snap.root), "reference": str(self.reference),
                               "candidate": str(self.candidate), "seed": int(seed),
                               "strict_state_dict": bool(strict_state_dict), "precision": precision,
                               "weights": weights})
        self.weights = reply.get("weights") if reply.get("weights") in ("state_dict", "seeded") else None
        self.load_reply = reply
        tampered = _names(reply.get("tampered"))
        if not reply.get("ok"):
            try:
                cat = FailureCategory(reply.get("category", "crash"))
            except ValueError:
                cat = FailureCategory.CRASH
            if cat in (FailureCategory.NONE, FailureCategory.INFRA_ERROR, FailureCategory.MISSING):
                cat = FailureCategory.CRASH
            err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
            why = _msg(reply.get("message")) or _msg(err.get("message"))
            return self._tamper_refusal(tampered) or Refusal(
                cat, (why if reply.get("message") else f"loading failed: {why}") if why else "loading failed")
        self.loaded = True
        self.loaded_seed = int(seed)
        del proc
        return self._tamper_refusal(tampered)

    def rebuild(self, seed: int, weights: str = "state_dict") -> Refusal | None:
        """Build both models again after ``seed`` in the candidate process, ``ModelNew`` taking
        ``Model``'s weights by ``weights`` as at load: profiling after verification compares
        timed outputs with a reference built after its own seed, so the candidate must hold
        that reference's weights, not the ones verification gave it."""
        reply = self._request({"op": "reseed", "seed": int(seed), "weights": weights})
        if not reply.get("ok"):
            return Refusal(FailureCategory.CRASH, f"ModelNew built again after seed {seed}: "
                                                  f"{_msg(reply.get('message') or reply.get('error'))[:800]}")
        self.loaded_seed = int(seed)
        return None

    def _tamper_refusal(self, tampered: list[str]) -> Refusal | None:
        if not tampered:
            return None
        from . import integrity

        return Refusal(FailureCategory.FORBIDDEN_OP, integrity.message(tampered, self.cand_name), {"tampered": tampered})

    def integrity(self) -> Refusal | None:
        reply = self._request({"op": "integrity"})
        late = _names(reply.get("late"))
        if late:  # the harness's own gap, not the candidate's doing: kept where a test can see it
            self.meta["harness_late_imports"] = late[:20]
        return self._tamper_refusal(_names(reply.get("tampered")))

    def _request(self, msg: dict, timeout: float | None = None) -> dict:
        assert self.proc is not None
        return self.proc.request(msg, timeout if timeout is not None else self.timeout)

    def fetch(self, msg: dict, key: str, timeout: float | None = None) -> tuple[dict, Any]:
        """Send ``msg``; its reply and the value under ``key`` rebuilt here. Outputs travel
        through host memory from the first time a CUDA IPC mapping fails."""
        assert self.proc is not None
        for _ in range(2):
            reply, fds = self.proc.call({**msg, "ipc": self.ipc}, timeout if timeout is not None else self.timeout)
            try:
                if not reply.get("ok") or key not in reply:
                    return reply, None
                return reply, tensors.rebuild(reply[key], fds, self.device)
            except tensors.WireError as exc:
                if exc.reason == "ipc" and self.ipc:
                    self.ipc = False
                    self.meta["output_transfer"] = f"host memory ({exc})"[:300]
                    continue
                raise CandidateProcessError(f"the candidate process sent a malformed output ({exc})", "protocol") from None
            finally:
                tensors.close_all(fds)
        raise CandidateProcessError("the candidate process's outputs could not be read", "protocol")

    def close(self) -> dict:
        info: dict = {}
        if self.proc is not None:
            info = self.proc.close()
            self.meta.update({f"job_{k}": v for k, v in info.items()})
        self.snap.remove()
        return info

    def close_into(self, *results: Any) -> None:
        """:meth:`close`, then record what the end found (processes left running and killed)
        in each result's metadata."""
        info = self.close()
        for r in results:
            if r is not None and isinstance(getattr(r, "metadata", None), dict):
                r.metadata.update({f"job_{k}": v for k, v in info.items()})

    def __enter__(self) -> "JudgeSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _relative(path: Path, root: Path) -> str | None:
    try:
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    except ValueError:
        return None
    return None if rel.startswith("..") else rel


def _names(v: Any) -> list[str]:
    return [str(x)[:200] for x in v[:50]] if isinstance(v, list) else []


def _msg(v: Any) -> str:
    return str(v)[:4000] if v is not None else ""


def refusal_from_error(err: CandidateProcessError, what: str) -> Refusal:
    cat = FailureCategory.TIMEOUT if err.reason == "timeout" else FailureCategory.CRASH
    return Refusal(cat, f"{what}: {err}")
