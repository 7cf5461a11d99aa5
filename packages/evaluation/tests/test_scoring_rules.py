"""The rule profile and the weight protocol each solution form is verified under."""

import pytest

from cuda_agent.core.errors import ConfigError
from cuda_agent.evaluation.scoring import ScoringOptions, judge_for
from cuda_agent.sandbox.judge.jobs import ProfileOptions, VerifyOptions


def options(**kw) -> tuple[dict, dict, dict]:
    judge = judge_for(executor=object(), o=ScoringOptions(**kw))  # the judge's options: no job runs
    (single, profile), (workspace, _) = judge.job_options(True), judge.job_options(False)
    return single, workspace, profile


def test_single_files_get_kernelbenchs_weights_and_workspaces_models_names():
    single, workspace, profile = options()
    assert single == {"rules": "cuda-agent", "weights": "auto"} and profile == {"weights": "auto"}
    assert workspace == {"rules": "cuda-agent"}
    v = VerifyOptions(**single)  # what the job builds from them
    assert v.rules == "cuda-agent" and v.weights == "auto" and v.guard.enabled
    assert ProfileOptions(**profile).weights == "auto" and VerifyOptions(**workspace).weights == "state_dict"


def test_the_profile_of_the_run_and_rules_off():
    single, _, _ = options(rules="kernelbench")
    v = VerifyOptions(**single)
    assert v.rules == "kernelbench" and not v.guard.enabled and "kernel_torch_ops" not in v.static_checks
    single, workspace, _ = options(rules="kernelbench", enforce_rules=False)
    assert single["rules"] == workspace["rules"] == "none"
    v = VerifyOptions(**workspace)
    assert v.static_checks == [] and not v.guard.enabled


def test_judge_options_of_eval_are_checked_up_front():
    with pytest.raises(ConfigError, match="build_worker"):
        judge_for(object(), ScoringOptions(judge={"build_worker": 2}))
    with pytest.raises(ConfigError, match="eval.verify_options"):
        judge_for(object(), ScoringOptions(verify_options={"num_input": 2}))
    j = judge_for(object(), ScoringOptions(judge={"build_workers": 3, "prebuild": True}))
    assert j.build_workers() == 3 and j.options.prebuild


def test_eval_judge_options_come_from_the_config(tmp_path):
    from cuda_agent.core.config import compose
    from cuda_agent.evaluation.evaluate import _scoring_options

    cfg = compose(overrides=["eval.judge.prebuild=false", "eval.judge.build_workers=3"])
    o = _scoring_options(cfg, "cpu", tmp_path)
    j = judge_for(object(), o)
    assert o.judge == {"prebuild": False, "build_workers": 3} and not j.options.prebuild and j.build_workers() == 0
