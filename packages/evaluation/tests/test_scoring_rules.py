"""The rule profile and the weight protocol each solution form is verified under."""

from cuda_agent.evaluation.scoring import CandidateEvaluator, ScoringOptions
from cuda_agent.evaluation.solutions import KERNELBENCH
from cuda_agent.sandbox.judge.jobs import ProfileOptions, VerifyOptions


def options(**kw) -> tuple[dict, dict, dict]:
    ev = CandidateEvaluator(executor=None, options=ScoringOptions(**kw))
    return ev.verify_job_options(KERNELBENCH), ev.verify_job_options("workspace"), ev.profile_job_options(KERNELBENCH)


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
