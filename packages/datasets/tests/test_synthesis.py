from __future__ import annotations

import json
import os
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cuda_agent.core.cli import main
from cuda_agent.core.errors import ConfigError
from cuda_agent.core.plugins import PluginManager
from cuda_agent.datasets.ops6k import Ops6KDataset, Ops6KOptions
from cuda_agent.datasets.synthesis.composer import PAPER_MIX, Candidate, RuleComposer
from cuda_agent.datasets.synthesis.llm import LLMComposer, build_composer, extract_code
from cuda_agent.datasets.synthesis.pipeline import SynthesisOptions, Synthesizer, format_report
from cuda_agent.datasets.synthesis.seeds import collect_seeds, torch_inventory
from cuda_agent.datasets.validate import static_problems

from datasets_testdata import model_code

FAST = {
    "shapes": "tiny",
    "workers": 2,
    "timeout_s": 60,
    "filters": {"compile": False, "min_ms": 0.0, "max_ms": 1000.0, "iters": 2, "warmup": 1},
    "decontamination": {"enabled": False},
}


def _opts(tmp_path, **kw):
    data = json.loads(json.dumps(FAST))
    for k, v in kw.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k].update(v)
        else:
            data[k] = v
    data.setdefault("output_dir", str(tmp_path / "out"))
    return SynthesisOptions.from_mapping(data)


def test_seeds_and_inventory():
    seeds = collect_seeds("auto")
    cats = Counter(o.category for o in seeds.values())
    for cat in ("activation", "elementwise", "reduction", "matmul", "conv", "norm", "pool", "softmax", "loss"):
        assert cats[cat] > 0, cat
    assert "nn.Conv2d" in seeds and "nn.Linear" in seeds
    assert not any(o.source == "transformers" for o in collect_seeds(False).values())
    assert not any(o.stochastic for o in collect_seeds(False, include_stochastic=False).values())
    inv = torch_inventory()
    assert any(name == "Conv2d" and covered for name, covered in inv["nn"])


def test_rule_composer_is_deterministic_and_well_formed():
    seeds = collect_seeds("auto")
    comp = RuleComposer(seeds, "small", seed=7)
    cands = [comp.compose(i) for i in range(1500)]
    assert all(c is not None for c in cands)
    assert comp.compose(11).code == cands[11].code
    assert RuleComposer(seeds, "small", seed=8).compose(11).code != cands[11].code
    for c in cands:
        assert static_problems(c.code) == [], c.code
        assert 1 <= c.n_ops <= 5 and len(c.ops) == c.n_ops
    mix = Counter(c.n_ops for c in cands)
    assert abs(mix[2] / len(cands) - PAPER_MIX[2]) < 0.04
    assert abs(mix[1] / len(cands) - PAPER_MIX[1]) < 0.02
    assert len({c.code for c in cands}) > 1400  # varied
    hf = sum(c.source == "transformers" for c in cands)
    if any(o.source == "transformers" for o in seeds.values()):
        assert 3 <= hf <= 50


def test_op_mix_option_and_errors():
    seeds = collect_seeds(False)
    comp = RuleComposer(seeds, "tiny", {"3": 1.0}, seed=0)
    assert {comp.compose(i).n_ops for i in range(50)} == {3}
    with pytest.raises(ConfigError, match="counts must be 1..5"):
        RuleComposer(seeds, "tiny", {"7": 1.0})
    with pytest.raises(ConfigError, match="unknown shape preset"):
        RuleComposer(seeds, "huge")


class ScriptedComposer:
    """Candidates whose fate is known: good ones, and bad ones of every kind."""

    name = "scripted"

    def __init__(self, codes):
        self.codes = codes

    def compose(self, index):
        if index >= len(self.codes):
            return None
        return Candidate(index, self.codes[index], [f"op{index}"], "torch", "scripted")


GOOD_A = model_code("self.lin = nn.Linear(16, 8)", "return torch.tanh(self.lin(x))")
GOOD_B = model_code("self.lin = nn.Linear(16, 12)", "return F.gelu(self.lin(x)) * 2.0")
HANG = model_code("pass", "while True:\n            pass")
CRASH = model_code("pass", "import os\n        os._exit(9)")
BAD_INPUTS = model_code("self.lin = nn.Linear(16, 8)", "return self.lin(x)", "[torch.rand(4, 5)]")
NO_INPUTS = GOOD_A.replace("def get_inputs", "def inputs")
SYNTAX = GOOD_A.replace("def forward(self, x):", "def forward(self, x)")


def test_bad_candidates_never_end_the_run(tmp_path):
    codes = [GOOD_A, HANG, SYNTAX, CRASH, BAD_INPUTS, NO_INPUTS, GOOD_A, GOOD_B]
    opts = _opts(tmp_path, num_tasks=5, timeout_s=8, max_candidates=len(codes))
    rep = Synthesizer(opts, composer=ScriptedComposer(codes), refs=[]).run(progress=False)
    assert rep["accepted"] == 2 and rep["candidates"] == 8 and not rep["complete"]
    assert rep["removed"] == {"invalid": 2, "duplicate": 1, "eager": 1, "timeout": 1, "crash": 1}
    recs = {r["index"]: r for r in map(json.loads, (tmp_path / "out" / "candidates.jsonl").read_text().splitlines())}
    assert recs[1]["filter"] == "timeout" and recs[3]["filter"] == "crash" and recs[4]["filter"] == "eager"
    assert "mat1 and mat2" in recs[4]["reason"] or "shape" in recs[4]["reason"]
    assert recs[2]["filter"] == "invalid" and "syntax error" in recs[2]["reason"]
    rows = [json.loads(x) for x in (tmp_path / "out" / "tasks.jsonl").read_text().splitlines()]
    assert [r["data_source"] for r in rows] == ["torch#1", "torch#2"]
    assert set(rows[0]) == {"ops", "data_source", "code"} and json.loads(rows[0]["ops"]) == ["op0"]
    assert "timeout" in format_report(rep)


def test_pipeline_end_to_end_resume_and_reload(tmp_path, kb_root):
    pytest.importorskip("pyarrow")
    opts = _opts(tmp_path, num_tasks=8, seed=3, write_parquet=True,
                 decontamination={"enabled": True, "kernelbench_root": str(kb_root)})
    rep = Synthesizer(opts).run(progress=False)
    assert rep["accepted"] == 8 and rep["complete"] and rep["settings"]["references"] == 250
    assert sum(rep["removed"].values()) + rep["accepted"] + rep["surplus"] == rep["candidates"]
    assert sum(int(v) for v in rep["op_mix"].values()) == 8
    out = tmp_path / "out"
    first = [json.loads(x) for x in (out / "candidates.jsonl").read_text().splitlines()]
    # resume with a larger target: judged candidates are not judged again
    opts2 = _opts(tmp_path, num_tasks=12, seed=3, write_parquet=True,
                  decontamination={"enabled": True, "kernelbench_root": str(kb_root)})
    rep2 = Synthesizer(opts2).run(progress=False)
    assert rep2["accepted"] == 12 and rep2["session"]["accepted"] == 4
    allrecs = [json.loads(x) for x in (out / "candidates.jsonl").read_text().splitlines()]
    idx = [r["index"] for r in allrecs]
    assert len(idx) == len(set(idx)) and idx[: len(first)] == [r["index"] for r in first]
    # the output loads as Ops-6K, from jsonl and from parquet
    tasks = list(Ops6KDataset(Ops6KOptions(path=str(out))).tasks())
    per_source = Counter(t.id.split("#", 1)[0] for t in tasks)
    assert len(tasks) == 12 and set(per_source) <= {"torch", "transformers"}
    # ids count the accepted tasks of each source from 1, in order
    assert sorted(t.id for t in tasks) == sorted(f"{s}#{i}" for s, n in per_source.items() for i in range(1, n + 1))
    assert all(t.metadata["n_ops"] >= 1 for t in tasks)
    assert len(list(Ops6KDataset(Ops6KOptions(path=str(out / "tasks.parquet"))).tasks())) == 12
    # other settings in the same folder: refused with a one-line error
    with pytest.raises(ConfigError, match="other settings"):
        Synthesizer(_opts(tmp_path, num_tasks=12, seed=4), refs=[]).run(progress=False)


def test_decontamination_needs_kernelbench(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_AGENT_KERNELBENCH", raising=False)
    with pytest.raises(ConfigError, match="decontamination needs KernelBench"):
        Synthesizer(_opts(tmp_path, decontamination={"enabled": True}))


# --- LLM composer against a loopback chat-completions server ----------------------------------


class _ChatServer:
    def __init__(self, reply_code: str):
        outer = self
        self.requests: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                n = len(outer.requests)
                content = (
                    "Here it is:\n```python\n" + reply_code.replace("nn.Linear(16, 8)", f"nn.Linear(16, {4 + n})") + "```\n"
                    if n != 2
                    else "I cannot do that."
                )
                data = json.dumps({
                    "id": f"c{n}", "object": "chat.completion", "model": body.get("model"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


def test_llm_composer_through_openai_policy(tmp_path):
    pm = PluginManager()
    if "openai" not in pm.components("policy"):
        pytest.skip("no openai policy plugin")
    server = _ChatServer(GOOD_A)
    try:
        opts = _opts(tmp_path, num_tasks=2, composer="llm", max_candidates=6,
                     llm={"policy": {"name": "openai", "options": {"model": "tiny", "base_url": server.url, "max_retries": 0}}})
        composer = build_composer(opts, pm)
        assert isinstance(composer, LLMComposer)
        rep = Synthesizer(opts, composer=composer, refs=[]).run(progress=False)
    finally:
        server.close()
    assert rep["accepted"] == 2 and rep["removed"].get("invalid") == 1
    req = server.requests[0]
    assert req["model"] == "tiny" and req["temperature"] == 0.8
    prompt = req["messages"][0]["content"]
    assert "class Model" in prompt and "get_init_inputs" in prompt
    recs = [json.loads(x) for x in (tmp_path / "out" / "candidates.jsonl").read_text().splitlines()]
    assert {r["composer"] for r in recs} == {"llm"}
    assert any("no Python code block" in r.get("reason", "") for r in recs)


def test_llm_composer_needs_a_policy(tmp_path):
    with pytest.raises(ConfigError, match="synthesis.llm.policy.name"):
        build_composer(_opts(tmp_path, composer="llm"))
    assert extract_code("text\n```python\nclass Model: pass\n```") == "class Model: pass\n"


# --- the command line --------------------------------------------------------------------------


def test_cli_synthesize_list_and_validate(tmp_path, kb_root, capsys):
    out = tmp_path / "synth"
    rc = main(["data", "synthesize", "--out", str(out), "-n", "4", "--no-progress",
               "synthesis.shapes=tiny", "synthesis.filters.compile=false", "synthesis.filters.min_ms=0",
               f"synthesis.decontamination.kernelbench_root={kb_root}", "synthesis.seed=11"])
    text = capsys.readouterr().out
    assert rc == 0 and "accepted 4/4" in text and "filter" in text and "paper" in text
    rc = main(["data", "list", "dataset.name=ops6k", f"dataset.options.path={out}", "--json"])
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rc == 0 and len(rows) == 4 and rows[0]["source"] == "ops6k"
    # validate a folder holding good and bad task files: each reported, none ends the run
    folder = tmp_path / "tasks"
    folder.mkdir()
    for name, code in {"good": GOOD_A, "syntax": SYNTAX, "noinputs": NO_INPUTS, "badinputs": BAD_INPUTS, "crash": CRASH}.items():
        (folder / f"{name}.py").write_text(code)
    rc = main(["data", "validate", "dataset.name=folder", f"dataset.options.path={folder}", "--timeout", "30",
               "--report", str(tmp_path / "rep.jsonl")])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    lines = {ln.split()[1].rstrip(":"): ln for ln in cap.out.splitlines() if ln.startswith(("ok", "BAD"))}
    assert lines["good"].startswith("ok")
    assert "[static] syntax error" in lines["syntax"] and "no get_inputs()" in lines["noinputs"]
    assert "[run]" in lines["badinputs"] and "[crash]" in lines["crash"]
    assert "5 tasks checked: 1 ok, 4 bad" in cap.err
    assert len((tmp_path / "rep.jsonl").read_text().splitlines()) == 5
    assert main(["data", "validate", "dataset.name=folder", f"dataset.options.path={folder}", "--no-run", "--strict"]) == 1
    assert "2 bad tasks (--strict)" in capsys.readouterr().err


def test_cli_errors_are_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_AGENT_KERNELBENCH", raising=False)
    assert main(["data", "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: no KernelBench location") and "\n" not in err
    assert "github.com/ScalingIntelligence/KernelBench" in err and "KernelBench/ folder" in err
    for bad in (tmp_path / "missing", tmp_path):  # a path that is not there, a folder without levels
        assert main(["data", "list", f"dataset.options.root={bad}"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "github.com/ScalingIntelligence/KernelBench" in err, err


WHOAMI = model_code("pass", "import os\n        assert os.geteuid() != 0, 'task code ran as root'\n        return x")


def test_task_code_runs_without_root_rights(tmp_path):
    """Candidates are judged as executor jobs whose process gave up root rights first."""
    opts = _opts(tmp_path, num_tasks=1, timeout_s=30, max_candidates=1)
    rep = Synthesizer(opts, composer=ScriptedComposer([WHOAMI]), refs=[]).run(progress=False)
    privileges = rep["session"]["privileges"]
    assert sum(privileges.values()) == 1, privileges
    if os.geteuid() == 0:
        assert rep["accepted"] == 1, rep["removed"]
        assert all(k.startswith("dropped to uid") for k in privileges), privileges
    else:
        assert all(k.startswith("kept") for k in privileges), privileges
