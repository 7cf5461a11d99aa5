"""Per-sample verdicts: the rule a refusal names, pass@k over samples, refusals by rule, and
samples.jsonl kept consistent with results.jsonl across resumed runs."""

import itertools
import json
import math

import pytest

from cuda_agent.core.types import CandidateOutcome, CompileResult, ProfileResult, Timing, VerifyResult, FailureCategory
from cuda_agent.core.types import Task
from cuda_agent.evaluation.metrics import TaskResult, compute_metrics, result_from_outcome
from cuda_agent.evaluation.report import build_report, render_html, render_markdown
from cuda_agent.evaluation.runner import ResultStore, run_tasks
from cuda_agent.evaluation.samples import (
    SampleResult,
    group_pass_at_k,
    ks_for,
    pass_at_k,
    refusals_by_rule,
    rule_in_message,
    rule_of,
    sample_counts,
    sample_from_result,
)


# --- the rule of a refusal ---------------------------------------------------------------

@pytest.mark.parametrize("message,rule", [
    ("model_new.py:3: uses torch._C (rule static.guard-tampering: the candidate may not reach into torch internals)",
     "static.guard-tampering"),
    ("ModelNew does not load Model's state_dict (rule state-dict: same parameter and buffer names and shapes "
     "as Model): Missing key(s)", "state-dict"),
    ("the timed loop took 105 ms on the trusted clock ... (rule timing.wall-clock: time spent in a call must be "
     "measured)", "timing.wall-clock"),
    ("forbidden op torch.add in ModelNew.forward (rule runtime.torch-function: torch functions other than tensor "
     "creation are blocked)", "runtime.torch-function"),
    ("a.py:1: x (rule static.fallback: why); b.py:2: y (rule static.reference-model: why)", "static.fallback"),
    ("output differs (rule tolerance.scale)", "tolerance.scale"),
    # words that merely contain or follow "rule" name no rule
    ("the schedule foo: bar", None),
    ("no matching rule for target 'all'", None),
    ("", None),
])
def test_rule_named_in_message(message, rule):
    assert rule_in_message(message) == rule


def test_rule_of_prefers_metadata_then_message_then_category():
    msg = "x (rule static.fallback: why)"
    assert rule_of("forbidden_op", msg, {"verify": {"rule": "judge.named"}}) == "judge.named"
    assert rule_of("forbidden_op", msg, {"rule": "top.level", "verify": {"rule": "judge.named"}}) == "top.level"
    assert rule_of("forbidden_op", msg, {"profile": {"rule": "timing.checksum"}}) == "timing.checksum"
    assert rule_of("forbidden_op", msg, {}) == "static.fallback"
    assert rule_of("wrong_result", "max abs err 0.5 at output[0]") == "wrong_result"
    assert rule_of("crash", "Segmentation fault") == "crash"
    assert rule_of("none", msg) is None


def test_result_from_outcome_names_the_rule_of_the_whole_message():
    # the rule comes after the 500 characters the task row keeps of the message
    long = "model_new.py:1: " + "x" * 600 + " (rule static.kernel-torch-op: kernels may not call torch)"
    r = result_from_outcome("L1/1_a", CandidateOutcome(verify=VerifyResult(ok=False, failure=FailureCategory.FORBIDDEN_OP,
                                                                           message=long)))
    assert len(r.message) == 500 and r.metadata["rule"] == "static.kernel-torch-op"
    meta = {"rule": "tolerance.constant", "weights": "seeded", "rule_profile": "kernelbench"}
    r = result_from_outcome("L1/1_a", CandidateOutcome(verify=VerifyResult(
        ok=False, failure=FailureCategory.WRONG_RESULT, message="output is constant (rule other: no)", metadata=meta)))
    assert r.metadata["rule"] == "tolerance.constant"  # the judge's own field wins over the message
    s = sample_from_result(r, sample="s1", index=0)
    assert (s.rule, s.weights, s.rule_profile, s.failure) == ("tolerance.constant", "seeded", "kernelbench", "wrong_result")
    r = result_from_outcome("L1/1_a", CandidateOutcome(compile=CompileResult(ok=False, errors=["k.cpp:3: error: x"])))
    assert r.metadata["rule"] == "compile_error"
    ok = result_from_outcome("L1/1_a", CandidateOutcome(
        verify=VerifyResult(ok=True, metadata={"weights": "state_dict"}),
        profile=ProfileResult(ok=True, candidate=Timing(0.5), eager=Timing(1.0), compile=Timing(2.0))))
    assert "rule" not in ok.metadata
    s = sample_from_result(ok, sample="s2", index=1)
    assert s.correct and s.rule is None and s.weights == "state_dict" and s.rule_profile is None
    assert (s.t_candidate_ms, s.t_eager_ms, s.t_compile_ms, s.speedup_vs_eager, s.speedup_vs_compile) == (0.5, 1.0, 2.0, 2.0, 4.0)


# --- pass@k --------------------------------------------------------------------------------

def test_pass_at_k_by_hand_and_by_enumeration():
    # n = 3 samples, c = 1 correct: pass@1 = 1/3; pass@2 = 1 - C(2,2)/C(3,2) = 1 - 1/3 = 2/3
    assert pass_at_k(3, 1, 1) == pytest.approx(1 / 3)
    assert pass_at_k(3, 1, 2) == pytest.approx(2 / 3)
    assert pass_at_k(3, 1, 3) == 1.0
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # C(3,3)/C(5,3) = 1/10
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    # the estimator is the share of k-subsets holding a correct sample
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(itertools.combinations([True] * c + [False] * (n - c), k))
                assert pass_at_k(n, c, k) == pytest.approx(sum(any(x) for x in subsets) / len(subsets)), (n, c, k)
    for bad in ((3, 4, 1), (3, 1, 0), (3, 1, 4)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_ks_are_one_and_powers_of_two():
    assert [ks_for(n) for n in (0, 1, 3, 4, 9)] == [[1], [1], [1, 2], [1, 2, 4], [1, 2, 4, 8]]


def test_group_pass_at_k_counts_empty_tasks_and_leaves_out_short_ones():
    g = group_pass_at_k([(3, 1), (0, 0), (1, 1), None], [1, 2])
    assert g["pass_at_k"]["1"] == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert g["pass_at_k"]["2"] == pytest.approx((2 / 3 + 0) / 2)  # (1, 1) has fewer than 2 samples
    assert g["pass_at_k_tasks"] == {"1": 3, "2": 2} and g["n_samples"] == 4 and g["tasks_with_samples"] == 3
    assert group_pass_at_k([None], [1])["pass_at_k"] == {"1": None}


def _s(task, index, correct, failure="none", rule=None, message="", candidate=0, level=1, batch="b"):
    return SampleResult(task, level, sample=f"s{index}", index=index, candidate=candidate, source=f"{task}/s{index}",
                        correct=correct, failure=failure, rule=rule, message=message, batch=batch)


def test_an_agent_attempt_passes_when_one_of_its_candidates_does():
    rows = [_s("t", 0, False, "wrong_result", "wrong_result"), _s("t", 0, True, candidate=1),
            _s("t", 1, False, "missing", "missing"), _s("u", 0, False, "crash", "crash")]
    assert sample_counts(rows) == {"t": (2, 1), "u": (1, 0)}


def test_metrics_gain_pass_at_k_per_level_and_overall():
    results = [TaskResult("L1/1_a", 1, correct=True, failure="none", candidates=3, metadata={"sample_batch": "b"}),
               TaskResult("L2/1_b", 2, correct=False, failure="wrong_result", candidates=2, metadata={"sample_batch": "b"}),
               TaskResult("L2/2_c", 2, correct=False, failure="missing", candidates=0),
               TaskResult("L2/3_d", 2, correct=True, failure="none", candidates=1)]  # scored before samples.jsonl
    samples = [_s("L1/1_a", 0, True), _s("L1/1_a", 1, False, "wrong_result", "wrong_result"),
               _s("L1/1_a", 2, False, "forbidden_op", "static.fallback"),
               _s("L2/1_b", 0, False, "wrong_result", "wrong_result", level=2),
               _s("L2/1_b", 1, False, "crash", "crash", level=2)]
    m = compute_metrics(results, samples=samples)
    assert m["L1"]["pass_at_k"] == pytest.approx({"1": 1 / 3, "2": 2 / 3})
    assert m["L2"]["pass_at_k"] == {"1": 0.0, "2": 0.0} and m["L2"]["tasks_with_samples"] == 2
    assert m["overall"]["pass_at_k"] == pytest.approx({"1": 1 / 9, "2": 2 / 9})
    assert "pass_at_k" not in compute_metrics(results)["overall"]


def test_refusals_by_rule():
    rows = [_s("L1/1_a", 0, True), _s("L1/1_a", 1, False, "wrong_result", "wrong_result", "max abs err 1\nmore"),
            _s("L1/1_a", 2, False, "forbidden_op", "static.fallback", "m.py:3: try (rule static.fallback: x)"),
            _s("L2/1_b", 0, False, "forbidden_op", "static.fallback", "m.py:9: try (rule static.fallback: x)", level=2),
            _s("L2/1_b", 1, False, "forbidden_op", "static.fallback", "", level=2)]
    out = refusals_by_rule(rows, lambda lv: f"L{lv}")
    assert [(e["rule"], e["count"]) for e in out] == [("static.fallback", 3), ("wrong_result", 1)]
    fb, wr = out
    assert fb["share"] == pytest.approx(3 / 5) and fb["tasks"] == ["L1/1_a", "L2/1_b"]
    assert fb["levels"] == {"L1": 1, "L2": 2} and fb["category"] == "forbidden_op"
    assert fb["example"] == "m.py:3: try (rule static.fallback: x)" and wr["example"] == "max abs err 1"


def test_report_sections_only_with_samples():
    results = [TaskResult("L1/1_a", 1, correct=True, failure="none", candidates=2, source="L1/1_a/s0",
                          metadata={"sample_batch": "b"})]
    samples = [_s("L1/1_a", 1, False, "crash", "crash", "Segmentation fault <core>"), _s("L1/1_a", 0, True)]
    rep = build_report(results, info={"title": "t"}, environment={}, samples=samples)
    assert [x["index"] for x in rep["samples"]] == [0, 1]  # in task and sample order
    assert rep["refusals"][0]["rule"] == "crash" and rep["metrics"]["overall"]["pass_at_k"] == {"1": 0.5, "2": 1.0}
    md = render_markdown(rep)
    assert "| overall | 1 | 2 | 50.0% | 100.0% |" in md and "| crash | crash | 1 | 50.0% | L1/1_a |" in md
    page = render_html(rep)
    assert "Segmentation fault &lt;core&gt;" in page and '<tr class="sample best" data-sample="s0"' in page
    json.dumps(rep)  # JSON-ready
    bare = build_report(results, info={"title": "t"}, environment={})
    assert bare["samples"] is None and bare["refusals"] is None
    assert "pass@k" not in render_markdown(bare) and "pass@k" not in render_html(bare)


# --- samples.jsonl across sessions -----------------------------------------------------------

def _tasks(*ids):
    return [Task(id=i, source="test", code="", level=1) for i in ids]


def _scored(task, n_samples, correct_index=0):
    """A task row with n samples, the way SolutionScorer makes one."""
    samples = [_s(task.id, i, i == correct_index, "none" if i == correct_index else "wrong_result",
                  None if i == correct_index else "wrong_result", batch="") for i in range(n_samples)]
    r = TaskResult(task.id, 1, correct=correct_index < n_samples, failure="none", candidates=n_samples,
                   source=f"{task.id}/s{correct_index}")
    r.samples = samples
    return r


def _file_rows(store):
    return [json.loads(x) for x in store.samples.path.read_text().splitlines() if x.strip()]


def test_samples_follow_the_task_rows_across_resumes(tmp_path):
    store = ResultStore(tmp_path / "results.jsonl")
    calls = []

    def flaky(task):
        calls.append(task.id)
        if task.id == "L1/2_b" and calls.count(task.id) == 1:
            raise RuntimeError("executor went away")  # a harness error: the task is redone on resume
        return _scored(task, 3 if task.id == "L1/1_a" else 2)

    run_tasks(_tasks("L1/1_a", "L1/2_b"), flaky, store, progress=False)
    assert [(r["task_id"], r["index"]) for r in _file_rows(store)] == [("L1/1_a", 0), ("L1/1_a", 1), ("L1/1_a", 2)]
    rows = store.load()
    assert rows["L1/1_a"].metadata["sample_batch"] == _file_rows(store)[0]["batch"]
    assert "sample_batch" not in rows["L1/2_b"].metadata and "samples" not in json.loads(
        store.path.read_text().splitlines()[0])  # the task row holds the best sample only
    # a kill between writing a batch and its task row leaves a batch no row names; a line cut short
    first = _file_rows(store)[0]["batch"]
    store.samples.append_batch("orphan", [_s("L1/2_b", 0, True, batch="")])
    with open(store.samples.path, "a") as f:
        f.write('{"task_id": "L1/2_b", "ind')
    assert [s.batch for s in store.samples_of(store.load().values())] == [first] * 3
    run_tasks(_tasks("L1/1_a", "L1/2_b", "L1/3_c"), flaky, store, progress=False)
    assert calls == ["L1/1_a", "L1/2_b", "L1/2_b", "L1/3_c"]  # finished tasks are not redone
    file_rows = _file_rows(store)
    keys = [(r["task_id"], r["index"]) for r in file_rows]
    assert sorted(keys) == sorted([("L1/1_a", i) for i in range(3)] + [("L1/2_b", i) for i in range(2)]
                                  + [("L1/3_c", i) for i in range(2)])
    assert len(keys) == len(set(keys)) and "orphan" not in {r["batch"] for r in file_rows}
    rows = store.load()
    assert all(r["batch"] == rows[r["task_id"]].metadata["sample_batch"] for r in file_rows)
    # a session with nothing left to do changes nothing
    before = store.samples.path.read_text()
    run_tasks(_tasks("L1/1_a", "L1/2_b", "L1/3_c"), flaky, store, progress=False)
    assert store.samples.path.read_text() == before and len(calls) == 4
    counts = compute_metrics(rows.values(), samples=store.samples_of(rows.values()))["overall"]
    assert counts["n_samples"] == 7 and counts["pass_at_k"]["1"] == pytest.approx((1 / 3 + 1 / 2 + 1 / 2) / 3)
    assert math.isclose(counts["pass_at_k"]["2"], (2 / 3 + 1 + 1) / 3)
