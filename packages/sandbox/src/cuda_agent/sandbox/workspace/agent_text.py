"""What the agent reads back from its tools: compile, verify and profile results as a few
short, actionable lines, and the JSON answer of each tool request (``text`` to print,
``exit_code``, ``result`` as JSON).
"""

from __future__ import annotations

from cuda_agent.core.types import (
    CandidateOutcome,
    CompileResult,
    FailureCategory,
    ProfileResult,
    RewardResult,
    Timing,
    VerifyResult,
    to_jsonable,
)


def _fmt_err(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1e}"


def _ms(t: Timing | None) -> str:
    if t is None:
        return "n/a"
    return f"{t.median_ms:.4g} ms" if t.median_ms < 1000 else f"{t.median_ms / 1000:.3g} s"


def _details_tail(details: str, lines: int = 8) -> str:
    rows = [r for r in (details or "").strip().splitlines() if r.strip()]
    if not rows:
        return ""
    return "\n".join("  " + r[:300] for r in rows[-lines:])


def compile_text(c: CompileResult) -> str:
    if c.ok:
        how = "cached" if c.cached else (
            "rebuilt: " + ", ".join(c.rebuilt_units[:6]) if c.rebuilt_units else "built")
        return f"COMPILE OK in {c.seconds:.1f} s ({how})"
    lines = [f"COMPILE FAILED ({len(c.errors)} error{'s' if len(c.errors) != 1 else ''}):" if c.errors
             else "COMPILE FAILED:"]
    for e in c.errors[:8]:
        lines.append("  " + e.strip()[:400])
    if len(c.errors) > 8:
        lines.append(f"  ... {len(c.errors) - 8} more")
    if not c.errors and c.log:
        lines.append(_details_tail(c.log, 20))
    return "\n".join(lines)


def verify_text(v: VerifyResult, compile_result: CompileResult | None = None) -> str:
    if v.failure is FailureCategory.COMPILE_ERROR and compile_result is not None and not compile_result.ok:
        return "VERIFY FAILED (compile error):\n" + compile_text(compile_result)
    if v.ok:
        n = len([c for c in v.checks if c.max_abs_err is not None or c.name.startswith("input")]) or len(v.checks)
        errs = [c.max_abs_err for c in v.checks if c.max_abs_err is not None]
        tol = v.metadata.get("atol"), v.metadata.get("rtol")
        parts = [f"VERIFY PASSED: {v.message}" if v.message else f"VERIFY PASSED ({n} checks)"]
        extra = []
        if errs and "max abs err" not in (v.message or ""):
            extra.append(f"max abs err {_fmt_err(max(errs))}")
        if tol[0] is not None and "atol" not in (v.message or ""):
            extra.append(f"atol={tol[0]:g} rtol={tol[1]:g}" if tol[1] is not None else f"atol={tol[0]:g}")
        if extra:
            parts.append(" (" + ", ".join(extra) + ")")
        return "".join(parts)
    head = f"VERIFY FAILED ({v.failure.value.replace('_', ' ')}): "
    msg = v.message.strip()
    failing = [c for c in v.checks if not c.passed]
    if not msg and failing:
        c = failing[0]
        msg = f"{c.name}: {c.message or ''} {c.where} max abs err {_fmt_err(c.max_abs_err)}".strip()
    lines = [head + (msg.splitlines()[0] if msg else "no details")]
    for extra in msg.splitlines()[1:6]:
        lines.append("  " + extra)
    for c in failing[1:4]:
        if c.message and c.message not in msg:
            lines.append(f"  {c.name}: {c.message}")
    tail = _details_tail(str(v.metadata.get("details", "")))
    if tail:
        lines.append("last output:")
        lines.append(tail)
    return "\n".join(lines)


def profile_text(p: ProfileResult, reward: RewardResult | None = None, verify: VerifyResult | None = None,
                 compile_result: CompileResult | None = None) -> str:
    if not p.ok:
        if verify is not None and not verify.ok:
            return verify_text(verify, compile_result) + "\nPROFILE SKIPPED: not timed until it verifies."
        msg = p.message.strip() or "no details"
        lines = [f"PROFILE FAILED ({p.failure.value.replace('_', ' ')}): {msg.splitlines()[0]}"]
        tail = _details_tail(str(p.metadata.get("details", "")))
        if tail:
            lines.append("last output:")
            lines.append(tail)
        return "\n".join(lines)
    parts = [f"eager {_ms(p.eager)}", f"torch.compile {_ms(p.compile)}", f"yours {_ms(p.candidate)}"]
    text = "PROFILE: " + ", ".join(parts)
    se, sc = p.speedup_vs_eager(), p.speedup_vs_compile()
    sp = []
    if se is not None:
        sp.append(f"{se:.2f}x vs eager")
    if sc is not None:
        sp.append(f"{sc:.2f}x vs compile")
    if sp:
        text += " -> " + ", ".join(sp)
    if reward is not None:
        text += f" (reward {reward.value:g})"
    return text


# --- the answer to one tool request ------------------------------------------------------


def compile_answer(c: CompileResult) -> dict:
    """The answer to ``/compile``."""
    return {"ok": c.ok, "kind": "compile", "exit_code": 0 if c.ok else 1,
            "text": compile_text(c), "result": to_jsonable(c)}


def reuse_note(endpoint: str, reused: list[str]) -> str:
    """What of a request's answer came from an earlier run of the same files ("" when nothing did)."""
    if not reused:
        return ""
    if endpoint == "verify" or "profile" in reused:
        return "\n(files unchanged since the last run: result reused)"
    return "\n(files unchanged since they were verified: that verdict reused, the timing ran now)"


def request_answer(endpoint: str, entry: dict) -> dict:
    """The answer to ``/verify``, ``/profile`` or ``/evaluate`` from the request's history entry."""
    out: CandidateOutcome = entry["outcome"]
    reward: RewardResult | None = entry["reward"]
    if endpoint == "verify":
        v = out.verify
        ok = bool(v and v.ok)
        text = verify_text(v, out.compile) if v is not None else "VERIFY FAILED: nothing was verified"
        result = to_jsonable(v)
    else:
        p = out.profile
        ok = bool(p is not None and p.ok and (out.verify is None or out.verify.ok))
        if p is None:
            text = profile_text(ProfileResult(ok=False, failure=out.failure), None, out.verify, out.compile)
        else:
            text = profile_text(p, reward, out.verify, out.compile)
        if endpoint == "evaluate" and out.verify is not None and out.verify.ok:
            text = verify_text(out.verify) + "\n" + text
        result = to_jsonable(out)
    text += reuse_note(endpoint, entry["reused"])
    return {"ok": ok, "kind": endpoint, "exit_code": 0 if ok else 1, "text": text, "result": result,
            "reward": to_jsonable(reward) if reward is not None else None}
