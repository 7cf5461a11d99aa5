"""Readable Markdown transcript of a trajectory."""

from __future__ import annotations

import json

from ..types import Candidate, Trajectory


def _fence(text: str, lang: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _speed(c: Candidate) -> str:
    p = c.outcome.profile
    if p is None or not p.ok:
        return "-"
    parts = []
    se, sc = p.speedup_vs_eager(), p.speedup_vs_compile()
    if se is not None:
        parts.append(f"{se:.2f}x eager")
    if sc is not None:
        parts.append(f"{sc:.2f}x compile")
    return ", ".join(parts) or "-"


_LANG = {".py": "python", ".cu": "cuda", ".cuh": "cuda", ".cpp": "cpp", ".cc": "cpp", ".h": "cpp", ".hpp": "cpp",
         ".md": "markdown", ".sh": "bash", ".json": "json", ".yaml": "yaml"}


def _lang(path: str) -> str:
    for ext, lang in _LANG.items():
        if str(path).endswith(ext):
            return lang
    return ""


def render_call(call) -> list[str]:
    """Markdown lines of one tool call (file contents and commands shown as code)."""
    a = call.arguments if isinstance(call.arguments, dict) else {}
    name = call.name or "(unnamed call)"
    path = a.get("path") if isinstance(a.get("path"), str) else None
    if call.error:
        return [f"**{name}** (malformed)", "", _fence(call.raw_arguments or "", "text"), ""]
    if name == "bash" and isinstance(a.get("command"), str):
        bg = " (background)" if a.get("run_in_background") else ""
        return [f"**bash**{bg}", "", _fence(a["command"], "bash"), ""]
    if name == "write" and path and isinstance(a.get("content"), str):
        return [f"**write** `{path}`", "", _fence(a["content"], _lang(path)), ""]
    if name == "edit" and path:
        return [f"**edit** `{path}`", "", _fence(str(a.get("old_string", "")), _lang(path)), "",
                "becomes", "", _fence(str(a.get("new_string", "")), _lang(path)), ""]
    if name == "read" and path and set(a) <= {"path"}:
        return [f"**read** `{path}`", ""]
    return [f"**{name}**", "", _fence(json.dumps(a, indent=2), "json"), ""]


def candidate_table(traj: Trajectory) -> str:
    rows = ["| turn | correct | speed | failure | files |", "| --- | --- | --- | --- | --- |"]
    for c in traj.candidates:
        mark = " (best)" if traj.best is not None and c.files == traj.best.files else ""
        rows.append(
            f"| {c.turn}{mark} | {'yes' if c.outcome.correct else 'no'} | {_speed(c)} | "
            f"{c.outcome.failure.value} | {', '.join(sorted(c.files))} |"
        )
    return "\n".join(rows)


def render_transcript(trajectory: Trajectory, max_result_chars: int = 4000) -> str:
    """A Markdown transcript: prompt, each turn's text, tool calls and results, candidates, reward."""
    t = trajectory
    out = [f"# Trajectory {t.id}", "", f"- task: `{t.task_id}`", f"- finish: {t.finish_reason}", f"- turns: {len(t.turns)}"]
    if t.reward is not None:
        r = t.reward
        extra = ""
        if r.speedup_vs_compile is not None:
            extra += f", {r.speedup_vs_compile:.2f}x vs compile"
        if r.speedup_vs_eager is not None:
            extra += f", {r.speedup_vs_eager:.2f}x vs eager"
        out.append(f"- reward ({r.reward}): {r.value:g} ({'correct' if r.correct else r.failure.value}{extra})")
    if t.response_ids:
        model_tokens = sum(t.loss_mask)
        out.append(f"- tokens: prompt {len(t.prompt_ids)}, response {len(t.response_ids)} ({model_tokens} from the model)")
    for key in ("policy", "model", "error"):
        if t.metadata.get(key):
            out.append(f"- {key}: {t.metadata[key]}")
    out.append("")
    for m in t.messages:  # the prompt: messages before the first answer
        if m.get("role") not in ("system", "user"):
            break
        body = _fence(str(m.get("content") or ""), "text")
        if m.get("role") == "system":  # long and the same every time: folded
            out += ["<details><summary>system prompt</summary>", "", body, "", "</details>", ""]
        else:
            out += [f"## {m['role']}", "", body, ""]
    for turn in t.turns:
        out += [f"## Turn {turn.index}" + (f" ({turn.seconds:.1f} s)" if turn.seconds else ""), ""]
        if turn.assistant.strip():
            out += [turn.assistant.strip(), ""]
        results = {r.call_id: r for r in turn.tool_results}
        for call in turn.tool_calls:
            out += render_call(call)
            res = results.get(call.id)
            if res is not None:
                text = res.content
                if len(text) > max_result_chars:
                    text = text[: max_result_chars // 2] + "\n[...]\n" + text[-max_result_chars // 2 :]
                status = "" if res.ok else " (error)"
                out += [f"result{status}:", "", _fence(text, "text"), ""]
    if t.candidates:
        out += ["## Candidates", "", candidate_table(t), ""]
    return "\n".join(out).rstrip() + "\n"
