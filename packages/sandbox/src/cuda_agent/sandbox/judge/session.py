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
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.core.types import FailureCategory

from . import snapshot, tensors
from .client import CandidateProcess, CandidateProcessError, claim, standby_for


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
        # this worker's candidate process, warmed ahead for the next job: the snapshot goes
        # into its inbox, the one folder of the host its view shows (see client)
        self.proc: CandidateProcess | None = claim(self.device, drop)
        self.inbox = self.proc.inbox if self.proc is not None else None
        inbox = str(self.inbox) if self.inbox is not None else None
        try:
            if cand_rel is not None and ref_rel is not None:
                files, folders = snapshot.workspace_files(ws, cand_rel, ref_rel)
                self.snap = snapshot.take(ws, files, folders, parent=inbox)
                self.candidate, self.reference = self.snap.path(cand_rel), self.snap.path(ref_rel)
            else:  # files outside one folder (a single-file solution beside a task folder)
                self.snap = snapshot.take(cand.parent, [cand.name], parent=inbox)
                ref_snap = snapshot.take(ref.parent, [ref.name], parent=str(self.snap.root))
                self.candidate, self.reference = self.snap.path(cand.name), ref_snap.path(ref.name)
                self.snap.refused.update(ref_snap.refused)
        except BaseException:
            if self.proc is not None:
                self.proc.close()
            if self.inbox is not None:
                shutil.rmtree(self.inbox, ignore_errors=True)
            raise
        self.cand_name = cand.name
        self.started = False  # the candidate process taken for the job and given its files
        self.loaded = False
        self.loaded_seed: int | None = None  # the seed the candidate's weights come from
        self.load_reply: dict = {}
        self.weights: str | None = None  # how ModelNew got Model's weights (the candidate process's report)
        self.native_findings: list[str] = []  # shared objects refused by their symbols (rule native.python-api)
        self._mapped_seen: set = set()  # the candidate's own mapped libraries already judged
        # the ways CUDA outputs may come here in device memory (tensors.DEVICE_WAYS), best
        # first; a way that fails once is dropped for the rest of the job (empty or False:
        # host memory only). The metadata's output_transfer names the way they came.
        self.ipc: list[str] | bool = list(tensors.DEVICE_WAYS)

    # -- what the snapshot holds -------------------------------------------------------

    def refused_files(self) -> str:
        """A message naming the judged files that were not copied (links, special files)."""
        if not self.snap.refused:
            return ""
        rel, why = next(iter(self.snap.refused.items()))
        return f"{rel} was not read: {why} (rule judge.files: the judged files must be regular files in the workspace)"

    # -- the candidate process ------------------------------------------------------

    def start(self) -> CandidateProcess:
        if self.proc is None or not self.started:
            from .checks import native_symbols

            prebuilt = self._prebuilt()
            self.native_findings = native_symbols.job_findings(self.snap.root, prebuilt and prebuilt["prebuilt"])
            if self.native_findings:  # nothing of it reaches the candidate process
                prebuilt = None
            self._take_process()
            self.proc.wait_ready()
            self.meta.update(self.proc.drop(str(self.snap.root), self.drop_enabled,
                                            prebuilt=self._handed(prebuilt)))
            self.meta.update({f"job_{k}": v for k, v in self.proc.isolation.items()})
        return self.proc

    def _take_process(self) -> None:
        """The warm candidate process claimed for this job, else one started now (the
        metadata's ``candidate_process`` says which, and why)."""
        standby_failed = ""
        if self.proc is not None and self.proc.standby:
            try:
                self.proc.wait_ready()
            except CandidateProcessError as exc:  # a new process is started for the job instead
                standby_failed = f"the worker's standby failed to start: {exc}"
            if not standby_failed and not self.proc.alive():
                standby_failed = "the worker's standby had ended"
        if self.proc is not None and self.proc.standby and not standby_failed:
            self.meta["candidate_process"] = ("standby (forked with the job's worker; its CUDA context made "
                                              "while this job went on)")
        elif self.proc is not None and not self.proc.standby and self.proc.wait_warm():
            self.meta["candidate_process"] = "warm (the job's user and namespaces made ahead of the job)"
        else:
            why = "none was waiting" if self.proc is None else (
                standby_failed or self.proc.warm_error or "it had ended")
            if self.proc is not None:
                self.proc.close()
            self.meta["candidate_process"] = f"started for the job ({why})"[:300]
            self.proc = CandidateProcess(self.device)
        self.started = True

    def _handed(self, prebuilt: dict | None) -> dict | None:
        """``prebuilt`` as a process dropped ahead of the job can read it: its files copied
        into the job's inbox (the folder it names is not in that process's view)."""
        if prebuilt is None or self.proc is None or self.proc.warmed is None or self.inbox is None:
            return prebuilt
        from ..isolation import privdrop
        from . import prebuild

        uid = self.proc.identity.uid if self.proc.identity is not None else None
        dest = Path(tempfile.mkdtemp(prefix="extensions-", dir=str(self.inbox)))
        os.chmod(dest, 0o755)
        privdrop.write_files(prebuild.read_files(Path(prebuilt["prebuilt"])), dest, uid, uid)
        return {**prebuilt, "prebuilt": str(dest)}

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
        return self._tamper_refusal(tampered) or self.mapped_refusal()

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
        return self._tamper_refusal(_names(reply.get("tampered"))) or self.mapped_refusal()

    def mapped_refusal(self) -> Refusal | None:
        """The shared objects the candidate's processes made and mapped themselves (built at
        import, inside the job), judged by their symbols from this side (rule
        ``native.python-api``; :func:`.checks.native_symbols.mapped_findings`)."""
        ident = getattr(self.proc, "identity", None)
        if ident is None or os.geteuid() != 0 or not os.path.isdir("/proc/self/map_files"):
            return None
        from . import identity
        from .checks import native_symbols

        found = native_symbols.mapped_findings(identity.processes_of(ident.uid), ident.uid, self._mapped_seen)
        self.native_findings += found
        return Refusal(FailureCategory.FORBIDDEN_OP, found[0], {"native": found[:20]}) if found else None

    def _request(self, msg: dict, timeout: float | None = None) -> dict:
        assert self.proc is not None
        return self.proc.request(msg, timeout if timeout is not None else self.timeout)

    def fetch(self, msg: dict, key: str, timeout: float | None = None) -> tuple[dict, Any]:
        """Send ``msg``; its reply and the value under ``key`` rebuilt here. A way of sharing
        device memory that fails to map is not offered again (the command is sent again the
        next way; host memory last)."""
        assert self.proc is not None
        failed: list[str] = []
        for _ in range(len(tensors.DEVICE_WAYS) + 1):
            ways = list(self.ipc) if isinstance(self.ipc, (list, tuple)) else []
            reply, fds = self.proc.call({**msg, "ipc": ways}, timeout if timeout is not None else self.timeout)
            try:
                if not reply.get("ok") or key not in reply:
                    return reply, None
                value = tensors.rebuild(reply[key], fds, self.device)
                self._transfer(reply[key], failed)
                return reply, value
            except tensors.WireError as exc:
                way = getattr(exc, "way", None)
                if exc.reason == "ipc" and way in ways:
                    self.ipc = [w for w in ways if w != way]
                    failed.append(f"{way}: {exc}"[:300])
                    continue
                raise CandidateProcessError(f"the candidate process sent a malformed output ({exc})", "protocol") from None
            finally:
                tensors.close_all(fds)
        raise CandidateProcessError("the candidate process's outputs could not be read", "protocol")

    def _transfer(self, spec: Any, failed: list[str]) -> None:
        """Record how this job's CUDA outputs came (the first time they came, and whenever a
        way failed): the way's name and, for host memory, why."""
        used = tensors.ways_used(spec)
        why = used.pop("why", None)
        used.pop("none", None)
        if not used or ("output_transfer" in self.meta and not failed):
            return
        if str(self.device).startswith("cuda") and set(used) == {"memfd"}:
            reasons = failed + ([f"the candidate process: {why}"] if why else [])
            if not reasons and not (isinstance(self.ipc, (list, tuple)) and self.ipc):
                reasons = ["device memory sharing is off"]
            text = f"host memory ({'; '.join(reasons) or 'outputs on the CPU'})"
        else:
            text = ", ".join(f"{tensors.WAY_NAMES.get(w, w)} ({w})" for w in sorted(used))
            if failed or why:
                text += f" (after {'; '.join(failed + ([why] if why else []))})"
        self.meta["output_transfer"] = text[:400]

    def end_candidate(self) -> dict:
        """End the candidate process (every process of its user killed and checked) and keep
        the snapshot: the next :meth:`load` takes a new process for the same files (the
        worker's standby when it has one, see :func:`.client.standby_for`; else one started
        then)."""
        info: dict = {}
        if self.proc is not None:
            info = self.proc.close()
            self.meta.update({f"job_{k}": v for k, v in info.items()})
            self.proc = None
        # the worker's standby, if it has one, goes on with its start at once: it makes its CUDA
        # context while this job goes on (no candidate code runs in it before the next load)
        self.proc = standby_for(self.device)
        self.started = False
        self.loaded, self.loaded_seed, self.load_reply = False, None, {}
        return info

    def close(self) -> dict:
        info: dict = {}
        if self.proc is not None:
            info = self.proc.close()
            self.meta.update({f"job_{k}": v for k, v in info.items()})
        self.snap.remove()
        if self.inbox is not None:
            shutil.rmtree(self.inbox, ignore_errors=True)
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
    from .client import KILLED_OUTSIDE

    cat = FailureCategory.TIMEOUT if err.reason == "timeout" else FailureCategory.CRASH
    extra = {KILLED_OUTSIDE: err.killed_outside} if getattr(err, "killed_outside", "") else {}
    return Refusal(cat, f"{what}: {err}", extra)
