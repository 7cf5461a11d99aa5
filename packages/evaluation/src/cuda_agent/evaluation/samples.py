"""Every candidate's verdict, one JSON line per sample in ``samples.jsonl``, and what is
computed from them: the rule that refused a sample, pass@k, refusals counted by rule.

A *sample* is one solution file (``eval --solutions``) or one agent attempt (an episode;
each of its verified candidates is a row, and the attempt passes when one of them is
correct). The task row of ``results.jsonl`` keeps the best sample; the rows of one task are
written as one batch whose id the task row names (``metadata.sample_batch``), so a task
redone on resume replaces its samples and a batch cut short by a kill is never read.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from .jsonl import append_lines, dumps, known_fields, read_records, rewrite_lines

if TYPE_CHECKING:  # metrics imports this module
    from .metrics import TaskResult

SAMPLES_FILE = "samples.jsonl"
BATCH_KEY = "sample_batch"  # TaskResult.metadata key naming the batch of the task's samples
# the judge's refusals name their rule: "... (rule static.fallback: why)"
_RULE = re.compile(r"\brule (\w[\w.\-]*\w|\w)(?=\s*[:)])")
JUDGE_KEYS = ("weights", "rule_profile")  # judge metadata copied onto each sample


def rule_in_message(message: str) -> str | None:
    """The first rule a message names (``rule <name>:`` or ``rule <name>)``), or None."""
    m = _RULE.search(message or "")
    return m.group(1) if m else None


def rule_of(failure: str, message: str = "", metadata: Mapping[str, Any] | None = None) -> str | None:
    """The rule that refused a candidate: the judge's ``metadata["rule"]`` when it carries
    one, else the rule its message names, else the failure category (``wrong_result``,
    ``crash``, ...). None for a correct candidate."""
    if failure == "none":
        return None
    md = metadata or {}
    for part in (md, md.get("verify") or {}, md.get("profile") or {}):
        if isinstance(part, Mapping) and part.get("rule"):
            return str(part["rule"])
    return rule_in_message(message) or failure


@dataclass
class SampleResult:
    """The verdict of one candidate of one task."""

    task_id: str
    level: int | None = None
    sample: str = ""  # the sample's name: solution sample folder/file stem, or "a<attempt>"
    index: int = 0  # the sample's number within its task (solution order, or agent attempt)
    candidate: int = 0  # the candidate's number within the sample (agent attempts verify several)
    source: str = ""  # the solution file or folder, or "<trajectory id>#turn<N>"
    trajectory: str | None = None
    correct: bool = False
    failure: str = "missing"
    rule: str | None = None
    message: str = ""
    t_candidate_ms: float | None = None
    t_eager_ms: float | None = None
    t_compile_ms: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    weights: str | None = None  # how the judge gave ModelNew its weights (state_dict | seeded)
    rule_profile: str | None = None  # the judge's rule profile
    seconds: float = 0.0
    batch: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SampleResult":
        return known_fields(cls, d)


def sample_from_result(r: "TaskResult", *, sample: str = "", index: int = 0, candidate: int = 0,
                       trajectory: str | None = None) -> SampleResult:
    """The sample row of one scored candidate."""
    md = r.metadata or {}
    verify = md.get("verify") if isinstance(md.get("verify"), Mapping) else {}
    judge = {k: md.get(k, verify.get(k)) for k in JUDGE_KEYS}
    return SampleResult(
        task_id=r.task_id, level=r.level, sample=sample, index=index, candidate=candidate, source=r.source,
        trajectory=trajectory, correct=r.correct, failure=r.failure,
        rule=None if r.correct else rule_of(r.failure, r.message, md), message=r.message,
        t_candidate_ms=r.t_candidate_ms, t_eager_ms=r.t_eager_ms, t_compile_ms=r.t_compile_ms,
        speedup_vs_eager=r.speedup_vs_eager, speedup_vs_compile=r.speedup_vs_compile,
        weights=None if judge["weights"] is None else str(judge["weights"]),
        rule_profile=None if judge["rule_profile"] is None else str(judge["rule_profile"]),
        seconds=round(float(r.seconds or 0.0), 3),
    )


# --- the store -----------------------------------------------------------------------


class SampleStore:
    """Append-only JSON lines of :class:`SampleResult`, in batches named by the task rows."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def append_batch(self, batch: str, samples: Sequence[SampleResult]) -> None:
        for s in samples:
            s.batch = batch
        with self._lock:
            append_lines(self.path, [dumps(s.to_dict()) for s in samples])

    def rows(self) -> list[SampleResult]:
        return list(read_records(self.path, SampleResult.from_dict))

    def current(self, results: Mapping[str, "TaskResult"]) -> list[SampleResult]:
        """The samples of the batches the task rows in ``results`` name (task id -> row)."""
        want = {tid: r.metadata.get(BATCH_KEY) for tid, r in results.items() if r.metadata.get(BATCH_KEY)}
        return [s for s in self.rows() if s.batch and want.get(s.task_id) == s.batch]

    def compact(self, results: Mapping[str, "TaskResult"]) -> None:
        """Rewrite the file with only :meth:`current` rows (stale batches of redone tasks and
        batches no task row names are dropped); atomic, so a kill leaves one file or the other."""
        with self._lock:
            if not self.path.exists():
                return
            rewrite_lines(self.path, [dumps(s.to_dict()) for s in self.current(results)])


# --- pass@k --------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator ``1 - C(n-c, k) / C(n, k)``: the chance that at least one of
    ``k`` samples drawn without replacement from ``n`` (``c`` of them correct) is correct."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if k < 1 or k > n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def sample_counts(samples: Iterable[SampleResult]) -> dict[str, tuple[int, int]]:
    """task id -> (samples, correct samples); a sample passes when one of its rows is correct."""
    seen: dict[str, dict[int, bool]] = {}
    for s in samples:
        per = seen.setdefault(s.task_id, {})
        per[s.index] = per.get(s.index, False) or bool(s.correct)
    return {tid: (len(per), sum(per.values())) for tid, per in seen.items()}


def ks_for(max_n: int) -> list[int]:
    """k = 1 and each power of two up to ``max_n``."""
    ks, k = [], 1
    while k <= max(max_n, 1):
        ks.append(k)
        k *= 2
    return ks


def group_pass_at_k(counts: Sequence[tuple[int, int] | None], ks: Sequence[int]) -> dict:
    """pass@k of a group of tasks, each given as (samples, correct) or None (no sample
    records: left out). A task with no sample counts 0 at every k (nothing to draw passes);
    a task with fewer than k samples is left out of pass@k (``tasks`` says how many count)."""
    known = [x for x in counts if x is not None]
    out: dict[str, Any] = {"n_samples": sum(n for n, _ in known), "tasks_with_samples": len(known),
                           "pass_at_k": {}, "pass_at_k_tasks": {}}
    for k in ks:
        vals = [0.0 if n == 0 else pass_at_k(n, c, k) for n, c in known if n == 0 or n >= k]
        out["pass_at_k"][str(k)] = sum(vals) / len(vals) if vals else None
        out["pass_at_k_tasks"][str(k)] = len(vals)
    return out


# --- refusals by rule ----------------------------------------------------------------


def refusals_by_rule(samples: Sequence[SampleResult], level_key: Any = None) -> list[dict]:
    """Failed samples counted by the rule that refused them, most frequent first: rule,
    category, count, share (of all samples), an example message, the tasks, counts per level."""
    total = len(samples)
    rules: dict[str, dict] = {}
    for s in samples:
        if s.correct:
            continue
        rule = s.rule or s.failure
        e = rules.setdefault(rule, {"rule": rule, "category": s.failure, "count": 0, "example": "", "tasks": [],
                                    "levels": {}})
        e["count"] += 1
        if not e["example"] and s.message.strip():
            e["example"] = s.message.strip().splitlines()[0][:300]
        if s.task_id not in e["tasks"]:
            e["tasks"].append(s.task_id)
        lv = level_key(s.level) if level_key else str(s.level)
        e["levels"][lv] = e["levels"].get(lv, 0) + 1
    out = sorted(rules.values(), key=lambda e: (-e["count"], e["rule"]))
    for e in out:
        e["share"] = e["count"] / total if total else None
    return out
