"""What ``cuda-agent train`` prints: a line per step, a first-to-last summary, the reward
curve written into the run folder, and no third-party progress bars."""

import json
import re
from pathlib import Path

from cuda_agent.core.cli import main
from cuda_agent.trainer.console import load_steps, summary, write_reward_plot

TOY = Path(__file__).resolve().parents[3] / "configs" / "toy.yaml"


def test_train_console_lines_summary_and_plot(tmp_path, capfd):
    rc = main(["train", str(TOY), f"run.output_dir={tmp_path}", "trainer.stages.0.steps=3", "logging.console=false",
               "--no-progress"])
    out, err = capfd.readouterr()
    assert rc == 0, err[-2000:]
    [run_dir] = [p for p in tmp_path.iterdir() if p.is_dir()]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    lines = out.splitlines()
    head = [i for i, ln in enumerate(lines) if ln.split()[:4] == ["step", "stage", "reward", "KL"]]
    assert len(head) == 1, out
    rows = [ln.split() for ln in lines[head[0] + 1: head[0] + 4]]
    for m, row in zip(metrics, rows):
        assert row[:3] == [str(m["step"]), "ppo", f"{m['reward/mean']:.3f}"], (row, m)
        assert row[3] == f"{m['actor/approx_kl']:.2e}" and row[5] == f"{m['rollout/tokens_per_s']:.0f}"
    assert f"reward mean      {metrics[0]['reward/mean']:.3f} -> {metrics[-1]['reward/mean']:.3f}" in out, out
    assert f"reward curve: {run_dir / 'reward.html'}" in out
    page = (run_dir / "reward.html").read_text()
    assert "<svg" in page and page.count("<circle") == 3
    for bar in ("Writing model shards", "Loading weights", "rollout step"):
        assert bar not in err and bar not in out, bar


def test_summary_and_plot_of_a_resumed_run(tmp_path):
    recs = [{"step": 0, "reward/mean": 0.1, "actor/loss": 0.5}, {"step": 1, "reward/mean": 0.4},
            {"step": 1, "reward/mean": 0.5, "actor/loss": 0.2}, {"step": 2, "reward/mean": 0.9, "actor/loss": 0.1}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n{\"step\": 3, \"rew")
    steps = load_steps(tmp_path)
    assert [s["step"] for s in steps] == [0, 1, 2] and steps[1]["reward/mean"] == 0.5  # a redone step once
    text = "\n".join(summary(steps))
    assert "3 steps (step 0 to 2)" in text and "0.100 -> 0.900" in text and "0.5 -> 0.1" in text
    assert "best reward      0.900 at step 2" in text
    page = write_reward_plot(steps, tmp_path).read_text()
    assert re.findall(r"<title>step (\d+): ", page) == ["0", "1", "2"]
    assert write_reward_plot([{"step": 0, "actor/loss": 1.0}], tmp_path / "none") is None
