"""The judge's pipeline (judge.pipeline): job timeouts that scale with the task's eager time."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.core.types import ProfileResult, Timing
from cuda_agent.sandbox.judge.pipeline import DEFAULT_COMPILER, Judge, JudgeOptions, default_compiler


def test_timeouts_scale_with_the_tasks_eager_time_once_known(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, code in ((a, "# task a\n"), (b, "# task b\n")):
        d.mkdir()
        (d / "model.py").write_text(code)
    judge = Judge(JudgeOptions(verify_timeout=300.0, profile_timeout=600.0, timeout_floor=90.0, timeout_calls=60,
                               hopeless_factor=20.0), executor=object(), backend="cpu")
    assert judge.timeout(a, 300.0) == 300.0  # nothing known of the task yet: the configured one
    judge._learn(a, ProfileResult(ok=True, eager=Timing(median_ms=10.0, spread=0.0)))
    assert judge.timeout(a, 300.0) == 90.0 + 60 * 0.010 * 20  # 102 s
    assert judge.timeout(a, None) == 102.0
    assert judge.timeout(a, 300.0, prebuilt=False) == 300.0  # a build inside the job keeps the full time
    assert judge.timeout(b, 600.0) == 600.0  # another task
    judge._learn(b, ProfileResult(ok=True, eager=Timing(median_ms=1000.0, spread=0.0)))
    assert judge.timeout(b, 600.0) == 600.0  # never above the configured timeout
    judge._learn(b, ProfileResult(ok=False, eager=Timing(median_ms=1.0, spread=0.0)))
    assert judge.timeout(b, 600.0) == 600.0  # a failed profile teaches nothing
    off = Judge(JudgeOptions(scale_timeouts=False), executor=object(), backend="cpu")
    off._learn(a, ProfileResult(ok=True, eager=Timing(median_ms=10.0, spread=0.0)))
    assert off.timeout(a, 300.0) == 300.0


def test_one_place_names_each_backends_default_compiler():
    assert default_compiler("cpu") == DEFAULT_COMPILER["cpu"] == "gxx"
    assert default_compiler("cuda") == default_compiler("auto") == "cpp_extension"
