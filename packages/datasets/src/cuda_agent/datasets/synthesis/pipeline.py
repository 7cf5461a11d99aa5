"""The synthesis pipeline: compose candidates, filter them as executor jobs, write Ops-6K rows.

Resumable: every candidate's verdict is appended to ``candidates.jsonl`` in the output
folder; a rerun with the same settings skips the candidates already judged (candidate
``i`` is a pure function of the seed and ``i``) and rebuilds ``tasks.jsonl`` from the
accepted ones. ``report.json`` counts the candidates each filter removed and the
op-count mix of the accepted tasks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cuda_agent.core.errors import ConfigError

from .composer import PAPER_MIX, PAPER_TRANSFORMERS_SHARE, Candidate
from .filters import FILTERS, FilterOptions, screen
from .similarity import Decontaminator

KERNELBENCH_ENV = "CUDA_AGENT_KERNELBENCH"


@dataclass
class DecontaminationOptions:
    enabled: bool = True
    kernelbench_root: str | None = None
    threshold: float = 0.9


@dataclass
class LLMOptions:
    policy: dict = field(default_factory=lambda: {"name": None, "options": {}})
    temperature: float = 0.8
    max_tokens: int = 2048
    prompt: str | None = None  # a template file; the built-in prompt when empty


@dataclass
class SynthesisOptions:
    output_dir: str = "data/synthesized"
    num_tasks: int = 100
    max_candidates: int | None = None  # default: 20 x num_tasks
    seed: int = 0
    workers: int = 2
    timeout_s: float = 120.0
    memory_limit_gb: float | None = 8.0
    threads_per_worker: int = 1
    executor: dict = field(default_factory=lambda: {"name": None, "options": {}})  # null: cpu, local for cuda
    batch_size: int = 8  # candidates per job (one process)
    device: str = "cpu"
    shapes: str = "small"
    composer: str = "rule"  # rule | llm
    op_mix: dict = field(default_factory=lambda: {str(k): v for k, v in PAPER_MIX.items()})
    transformers: str = "auto"  # auto | true | false
    transformers_share: float = PAPER_TRANSFORMERS_SHARE
    stochastic_seeds: bool = True  # keep random ops among the seeds (the filter removes them)
    write_parquet: bool = False
    filters: FilterOptions = field(default_factory=FilterOptions)
    decontamination: DecontaminationOptions = field(default_factory=DecontaminationOptions)
    llm: LLMOptions = field(default_factory=LLMOptions)

    @classmethod
    def from_mapping(cls, data: dict | None) -> "SynthesisOptions":
        data = dict(data or {})
        kw: dict[str, Any] = {}
        names = {f.name for f in dataclasses.fields(cls)}
        for key, value in data.items():
            if key not in names:
                raise ConfigError(f"unknown synthesis option {key!r}")
            kw[key] = value
        sub = {"filters": FilterOptions, "decontamination": DecontaminationOptions, "llm": LLMOptions}
        for key, typ in sub.items():
            if key in kw and isinstance(kw[key], dict):
                fields = {f.name for f in dataclasses.fields(typ)}
                bad = [k for k in kw[key] if k not in fields]
                if bad:
                    raise ConfigError(f"unknown option synthesis.{key}.{bad[0]}")
                kw[key] = typ(**kw[key])
        opts = cls(**kw)
        if opts.num_tasks < 0:
            raise ConfigError("synthesis.num_tasks must be >= 0")
        if opts.batch_size < 1:
            raise ConfigError(f"synthesis.batch_size must be >= 1, got {opts.batch_size}")
        if opts.filters.min_ms > opts.filters.max_ms:
            raise ConfigError("synthesis.filters.min_ms is above max_ms")
        return opts

    def fingerprint(self) -> str:
        """Settings that decide which candidates exist and how they are judged."""
        keep = dataclasses.asdict(self)
        for k in ("output_dir", "num_tasks", "max_candidates", "workers", "timeout_s", "write_parquet",
                  "memory_limit_gb", "threads_per_worker", "executor", "batch_size"):
            keep.pop(k, None)
        return hashlib.sha1(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def kernelbench_refs(opts: SynthesisOptions, fallback_root: str | None = None) -> list[tuple[str, list[str]]]:
    from ..kernelbench import WHERE_TO_GET, read_kernelbench
    from .similarity import structure_tokens

    d = opts.decontamination
    if not d.enabled:
        return []
    root = d.kernelbench_root or os.environ.get(KERNELBENCH_ENV) or fallback_root
    if not root:
        raise ConfigError(
            "decontamination needs KernelBench: set synthesis.decontamination.kernelbench_root=<path> "
            f"or ${KERNELBENCH_ENV} (or synthesis.decontamination.enabled=false); {WHERE_TO_GET}"
        )
    path = Path(os.path.expanduser(root))
    if not path.exists():
        raise ConfigError(f"KernelBench not found at {path}; {WHERE_TO_GET}")
    return [(t.id, structure_tokens(t.code)) for t in read_kernelbench(path)]


def _hash(code: str) -> str:
    return hashlib.sha1(code.encode()).hexdigest()


class Synthesizer:
    """One synthesis run into ``opts.output_dir``."""

    def __init__(
        self,
        opts: SynthesisOptions,
        composer: Any = None,
        refs: list[tuple[str, list[str]]] | None = None,
        kernelbench_root: str | None = None,
    ):
        self.opts = opts
        self.out = Path(opts.output_dir)
        self.refs = refs if refs is not None else kernelbench_refs(opts, kernelbench_root)
        if composer is None:
            from .llm import build_composer

            composer = build_composer(opts)
        self.composer = composer

    # -- state ------------------------------------------------------------------
    @property
    def candidates_path(self) -> Path:
        return self.out / "candidates.jsonl"

    @property
    def tasks_path(self) -> Path:
        return self.out / "tasks.jsonl"

    def _load_state(self, fresh: bool) -> list[dict]:
        state_path = self.out / "state.json"
        if fresh and self.out.exists():
            for name in ("candidates.jsonl", "tasks.jsonl", "state.json", "report.json", "tasks.parquet"):
                p = self.out / name
                if p.exists():
                    p.unlink()
        self.out.mkdir(parents=True, exist_ok=True)
        fp = self.opts.fingerprint()
        if state_path.exists():
            prev = json.loads(state_path.read_text())
            if prev.get("fingerprint") != fp:
                raise ConfigError(
                    f"{self.out} holds a synthesis run with other settings; use another output dir or --fresh"
                )
        records = []
        if self.candidates_path.exists():
            with open(self.candidates_path, encoding="utf-8") as f:
                for line in f:
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue  # a line cut by an interrupted write
        state_path.write_text(json.dumps({"fingerprint": fp, "settings": dataclasses.asdict(self.opts)}, indent=2, default=str))
        return records

    # -- run ----------------------------------------------------------------------
    def run(
        self,
        fresh: bool = False,
        progress: bool = True,
        on_record: Callable[[dict], None] | None = None,
        deadline_s: float | None = None,
    ) -> dict:
        """Synthesise until ``num_tasks`` are accepted, ``max_candidates`` are judged or
        ``deadline_s`` seconds have passed (no new candidates after it; in-flight ones finish)."""
        opts = self.opts
        records = self._load_state(fresh)
        done = {r["index"] for r in records}
        hashes = {r["hash"] for r in records if r.get("hash")}
        accepted = [r for r in records if r.get("ok") and not r.get("surplus")]
        per_source = Counter(r.get("source", "torch") for r in accepted)
        target = opts.num_tasks
        max_cand = opts.max_candidates if opts.max_candidates is not None else max(20 * target, 100)
        self._rewrite_tasks(accepted)
        session = Counter()
        t_start = time.monotonic()
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=target, initial=min(len(accepted), target), desc="synthesize", unit="task",
                       dynamic_ncols=True, file=sys.stderr)
        cand_f = open(self.candidates_path, "a", encoding="utf-8")
        tasks_f = open(self.tasks_path, "a", encoding="utf-8")

        def record(rec: dict) -> None:
            session["candidates"] += 1
            if rec.get("ok") and len(accepted) >= target:
                rec["surplus"] = True
            if rec.get("ok") and not rec.get("surplus"):
                src = rec.get("source", "torch")
                per_source[src] += 1
                rec["data_source"] = f"{src}#{per_source[src]}"
                accepted.append(rec)
                session["accepted"] += 1
                tasks_f.write(json.dumps(self._row(rec)) + "\n")
                tasks_f.flush()
                if bar is not None:
                    bar.update(1)
            elif not rec.get("ok"):
                session["removed:" + rec.get("filter", "?")] += 1
            if not rec.get("ok") or rec.get("surplus"):
                rec.pop("code", None)  # keep the log small: only accepted code is stored
            cand_f.write(json.dumps(rec) + "\n")
            cand_f.flush()
            records.append(rec)
            if bar is not None:
                rej = sum(v for k, v in session.items() if k.startswith("removed:"))
                bar.set_postfix(cand=len(records), removed=rej, refresh=False)
            if on_record is not None:
                on_record(rec)

        decon = Decontaminator(self.refs, opts.decontamination.threshold) if self.refs else None

        def items():
            for i in range(max_cand):
                if len(accepted) >= target:
                    return
                if deadline_s is not None and time.monotonic() - t_start > deadline_s:
                    return
                if i in done:
                    continue
                cand = self.composer.compose(i)
                if cand is None or not cand.code:
                    reason = (cand.meta.get("error") if cand is not None else None) or "composer produced no model"
                    base = self._base(cand, "") if cand is not None else {"index": i, "ops": [], "n_ops": 0}
                    record(base | {"ok": False, "filter": "invalid", "reason": reason})
                    continue
                h = _hash(cand.code)
                if h in hashes:
                    record(self._base(cand, h) | {"ok": False, "filter": "duplicate", "reason": "same code as an earlier candidate"})
                    continue
                hashes.add(h)
                static = screen(cand.code, decon)
                static.pop("ok")
                if "filter" in static:
                    record(self._base(cand, h) | {"ok": False} | static)
                    continue
                yield (cand, h, static), cand.code

        try:
            if target > len(accepted):
                self._judge(items(), record, session)
        finally:
            cand_f.close()
            tasks_f.close()
            if bar is not None:
                bar.close()
        wall = time.monotonic() - t_start
        report = self.report(records, accepted, session, wall, max_cand)
        (self.out / "report.json").write_text(json.dumps(report, indent=2))
        if opts.write_parquet:
            from ..tables import write_rows

            write_rows([self._row(r) for r in accepted], self.out / "tasks.parquet")
        return report

    def _judge(self, items, record: Callable[[dict], None], session: Counter) -> None:
        """Run the run filters on ``items`` (``((cand, hash, static verdict), code)``) as jobs."""
        from ..untrusted import open_executor, run_tasks

        opts = self.opts
        executor = open_executor(opts.executor, device=opts.device, workers=opts.workers,
                                 memory_limit_gb=opts.memory_limit_gb, where="synthesis.executor",
                                 preload=["torch._dynamo"] if opts.filters.compile else [])
        shared = {"filters": dataclasses.asdict(opts.filters) | {"device": opts.device}}
        try:
            for (cand, h, static), result in run_tasks(
                executor, "cuda_agent.datasets.synthesis.filters:check_candidate", items, timeout=opts.timeout_s,
                batch_size=opts.batch_size, init="cuda_agent.datasets.synthesis.filters:init_filters",
                shared=shared, threads=opts.threads_per_worker, label="synthesis",
            ):
                rec = self._base(cand, h) | static
                rec["ok"] = bool(result.get("ok"))
                rec["filter"] = result.get("filter") or ("" if rec["ok"] else result.get("stage", "crash"))
                for k in ("reason", "eager_ms", "compile_s", "output_shapes", "seconds"):
                    if k in result:
                        rec[k] = result[k]
                session["privileges:" + result.get("privileges", "")] += 1
                if rec["ok"]:
                    rec["code"] = cand.code
                record(rec)
        finally:
            executor.close()

    @staticmethod
    def _base(cand: Candidate, h: str) -> dict:
        return {
            "index": cand.index,
            "hash": h,
            "ops": cand.ops,
            "n_ops": cand.n_ops,
            "source": cand.source,
            "composer": cand.composer,
        }

    @staticmethod
    def _row(rec: dict) -> dict:
        return {"ops": json.dumps(rec["ops"]), "data_source": rec["data_source"], "code": rec["code"]}

    def _rewrite_tasks(self, accepted: list[dict]) -> None:
        tmp = self.tasks_path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for r in accepted:
                f.write(json.dumps(self._row(r)) + "\n")
        shutil.move(tmp, self.tasks_path)

    def report(self, records: list[dict], accepted: list[dict], session: Counter, wall: float, max_cand: int) -> dict:
        removed = Counter(r.get("filter", "?") for r in records if not r.get("ok"))
        n = len(records)
        mix = Counter(r["n_ops"] for r in accepted)
        cand_mix = Counter(r.get("n_ops", 0) for r in records)
        sources = Counter(r.get("source", "torch") for r in accepted)
        ems = sorted(r["eager_ms"] for r in accepted if r.get("eager_ms") is not None)

        def pct(xs, q):
            return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None

        return {
            "output_dir": str(self.out),
            "target": self.opts.num_tasks,
            "accepted": len(accepted),
            "candidates": n,
            "max_candidates": max_cand,
            "complete": len(accepted) >= self.opts.num_tasks,
            "removed": {k: removed.get(k, 0) for k in FILTERS if removed.get(k, 0)} | {
                k: v for k, v in removed.items() if k not in FILTERS
            },
            "surplus": sum(1 for r in records if r.get("surplus")),
            "acceptance_rate": len(accepted) / n if n else 0.0,
            "op_mix": {str(k): mix[k] for k in sorted(mix)},
            "candidate_op_mix": {str(k): cand_mix[k] for k in sorted(cand_mix)},
            "sources": dict(sources),
            "eager_ms": {"median": statistics.median(ems) if ems else None, "p10": pct(ems, 0.1), "p90": pct(ems, 0.9)},
            "session": {
                "seconds": round(wall, 2),
                "candidates": session["candidates"],
                "accepted": session["accepted"],
                "tasks_per_s": round(session["accepted"] / wall, 3) if wall > 0 else None,
                "candidates_per_s": round(session["candidates"] / wall, 3) if wall > 0 else None,
                # whom the candidates' code ran as (jobs by privileges: "dropped to uid ..." as root)
                "privileges": {k.split(":", 1)[1]: v for k, v in session.items() if k.startswith("privileges:")},
            },
            "settings": {
                "seed": self.opts.seed,
                "shapes": self.opts.shapes,
                "device": self.opts.device,
                "workers": self.opts.workers,
                "window_ms": [self.opts.filters.min_ms, self.opts.filters.max_ms],
                "compile": self.opts.filters.compile,
                "compile_backend": self.opts.filters.compile_backend,
                "decontamination": self.opts.decontamination.enabled,
                "references": len(self.refs),
                "composer": self.opts.composer,
            },
        }


def format_report(rep: dict) -> str:
    lines = []
    n = rep["candidates"] or 1
    lines.append(f"accepted {rep['accepted']}/{rep['target']} from {rep['candidates']} candidates "
                 f"({100.0 * rep['acceptance_rate']:.1f}%)  -> {rep['output_dir']}")
    s = rep["session"]
    if s["seconds"]:
        lines.append(f"this session: {s['accepted']} tasks, {s['candidates']} candidates in {s['seconds']:.1f} s "
                     f"({s['tasks_per_s']} tasks/s, {s['candidates_per_s']} candidates/s)")
    lines.append("")
    lines.append(f"{'filter':<18} {'removed':>8} {'share':>7}")
    for k, v in rep["removed"].items():
        lines.append(f"{k:<18} {v:>8} {100.0 * v / n:>6.1f}%")
    lines.append(f"{'(passed)':<18} {rep['accepted'] + rep['surplus']:>8} {100.0 * (rep['accepted'] + rep['surplus']) / n:>6.1f}%")
    lines.append("")
    acc = rep["accepted"] or 1
    lines.append(f"{'ops':<5} {'tasks':>6} {'share':>7} {'paper':>7}")
    for k in ("1", "2", "3", "4", "5"):
        c = rep["op_mix"].get(k, 0)
        lines.append(f"{k:<5} {c:>6} {100.0 * c / acc:>6.1f}% {100.0 * PAPER_MIX[int(k)]:>6.1f}%")
    hf = rep["sources"].get("transformers", 0)
    lines.append(f"{'hf':<5} {hf:>6} {100.0 * hf / acc:>6.1f}% {100.0 * PAPER_TRANSFORMERS_SHARE:>6.1f}%  (with a transformers module)")
    e = rep["eager_ms"]
    if e["median"] is not None:
        lines.append(f"\neager time of accepted tasks: median {e['median']:.3f} ms (p10 {e['p10']:.3f}, p90 {e['p90']:.3f})")
    return "\n".join(lines)
