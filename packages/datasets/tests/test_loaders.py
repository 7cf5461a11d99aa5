from __future__ import annotations

import json
import sys
import types

import pytest

from cuda_agent.core.config import compose
from cuda_agent.core.errors import ConfigError
from cuda_agent.core.plugins import PluginManager
from cuda_agent.datasets.folder import FolderDataset, FolderOptions
from cuda_agent.datasets.kernelbench import KernelBenchDataset, KernelBenchOptions
from cuda_agent.datasets.ops6k import Ops6KDataset, Ops6KOptions, parse_ops
from cuda_agent.datasets.selection import parse_split
from cuda_agent.datasets.tables import write_rows

from datasets_testdata import GOOD


def test_kernelbench_counts_and_ids(kb_root):
    ds = KernelBenchDataset(KernelBenchOptions(root=str(kb_root)))
    tasks = list(ds.tasks())
    by_level = {lvl: sum(t.level == lvl for t in tasks) for lvl in (1, 2, 3)}
    assert by_level == {1: 100, 2: 100, 3: 50}
    assert not ds.skipped
    ids = {t.id for t in tasks}
    assert "L1/19_ReLU" in ids and len(ids) == 250
    relu = next(t for t in tasks if t.id == "L1/19_ReLU")
    assert relu.name == "ReLU" and relu.source == "kernelbench" and "class Model" in relu.code
    assert relu.metadata["problem_id"] == 19 and relu.metadata["file"].endswith("19_ReLU.py")
    # ordered by level, then problem number
    assert [t.metadata["problem_id"] for t in tasks[:3]] == [1, 2, 3] and tasks[-1].id.startswith("L3/50_")


def test_kernelbench_selection(kb_root):
    def sel(**kw):
        return [t.id for t in KernelBenchDataset(KernelBenchOptions(root=str(kb_root), **kw)).tasks()]

    assert len(sel(levels=[1, 3])) == 150
    assert sel(ids=["L1/19_ReLU", "L2/1_*"]) == ["L1/19_ReLU", "L2/1_Conv2D_ReLU_BiasAdd"]
    assert all("Softmax" in i for i in sel(pattern="*Softmax*"))
    assert len(sel(pattern="re:^Conv2d_")) > 3
    a, b = sel(sample=10, seed=3), sel(sample=10, seed=3)
    assert a == b and len(a) == 10 and a != sel(sample=10, seed=4)
    assert len(sel(levels=[2], limit=7)) == 7
    assert len(sel(split="test[:10%]")) == 25
    with pytest.raises(ConfigError, match="unknown split 'train'"):
        sel(split="train")


def test_kernelbench_root_from_env_and_errors(kb_root, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_AGENT_KERNELBENCH", str(kb_root))
    assert len(list(KernelBenchDataset(KernelBenchOptions(levels=[3])).tasks())) == 50
    monkeypatch.delenv("CUDA_AGENT_KERNELBENCH")
    with pytest.raises(ConfigError, match="dataset.options.root=<path> or the environment variable CUDA_AGENT_KERNELBENCH"):
        list(KernelBenchDataset(KernelBenchOptions()).tasks())
    with pytest.raises(ConfigError, match="no level1"):
        list(KernelBenchDataset(KernelBenchOptions(root=str(tmp_path))).tasks())


def test_plugins_and_config(kb_root):
    pm = PluginManager()
    assert {"kernelbench", "ops6k", "folder"} <= set(pm.components("dataset"))
    ds = pm.create("dataset", {"name": "kernelbench", "options": {"root": str(kb_root), "levels": [2]}})
    assert len(ds) == 100
    cfg = compose([], ["dataset.options.levels=[1]", "synthesis.num_tasks=5"], pm=pm)
    assert cfg.dataset.name == "kernelbench" and cfg.synthesis.filters.max_ms == 50.0
    with pytest.raises(ConfigError, match="unknown option"):
        compose([], ["dataset.options.lvls=[1]"], pm=pm)


ROWS = [
    {"ops": '["nn.Conv2d", "torch.relu"]', "data_source": "torch#1", "code": GOOD},
    {"ops": "['nn.Linear']", "data_source": "torch#2", "code": GOOD},
    {"ops": "F.gelu, torch.sum, nn.LayerNorm", "data_source": "transformers#1", "code": GOOD},
    {"ops": "[]", "data_source": "torch#3", "code": "def broken(:\n"},
]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "arrow"])
def test_ops6k_local_formats(tmp_path, fmt):
    if fmt != "jsonl":
        pytest.importorskip("pyarrow")
    path = write_rows(ROWS, tmp_path / "data" / f"train-00000-of-00001.{fmt}")
    ds = Ops6KDataset(Ops6KOptions(path=str(tmp_path)))
    tasks = list(ds.tasks())
    assert [t.id for t in tasks] == ["torch#1", "torch#2", "transformers#1"]
    assert tasks[0].metadata["ops"] == ["nn.Conv2d", "torch.relu"] and tasks[0].metadata["n_ops"] == 2
    assert tasks[2].metadata["ops"] == ["F.gelu", "torch.sum", "nn.LayerNorm"]
    assert tasks[2].category == "transformers" and tasks[0].source == "ops6k"
    assert [r.id for r in ds.skipped] == ["torch#3"] and "syntax error" in ds.skipped[0].reason
    assert ds.available_splits() == ("train",)
    one = Ops6KDataset(Ops6KOptions(path=str(path), ids=["transformers#*"]))
    assert [t.id for t in one.tasks()] == ["transformers#1"]


def test_ops6k_missing_column_and_offline(tmp_path, monkeypatch):
    write_rows([{"ops": "[]", "text": "x"}], tmp_path / "bad.jsonl")
    with pytest.raises(ConfigError, match="no column 'code'"):
        list(Ops6KDataset(Ops6KOptions(path=str(tmp_path / "bad.jsonl"))).tasks())
    monkeypatch.delenv("CUDA_AGENT_OPS6K", raising=False)
    with pytest.raises(ConfigError, match="hub access is off"):
        list(Ops6KDataset(Ops6KOptions(hub="never")).tasks())
    # with the 'datasets' package present but no hub: a one-line error, no hang
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda *a, **k: (_ for _ in ()).throw(AssertionError("must not be called offline"))
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(ConfigError, match="unreachable"):
        list(Ops6KDataset(Ops6KOptions(hub_timeout_s=2)).tasks())
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ConfigError, match="'datasets' package is not installed"):
        list(Ops6KDataset(Ops6KOptions()).tasks())


def test_parse_ops_and_split():
    assert parse_ops('["a", "b"]') == ["a", "b"]
    assert parse_ops("['a','b']") == ["a", "b"]
    assert parse_ops("a; b") == ["a", "b"]
    assert parse_ops(None) == [] and parse_ops(["x"]) == ["x"]
    assert parse_split("train[10%:20%]") == ("train", "10%", "20%")
    with pytest.raises(ConfigError):
        parse_split("train[")


def test_folder_loader_reports_bad_files(tmp_path):
    (tmp_path / "level2").mkdir()
    (tmp_path / "level2" / "7_Good.py").write_text(GOOD)
    (tmp_path / "plain.py").write_text(GOOD)
    (tmp_path / "syntax.py").write_text(GOOD.replace("def forward(self, x):", "def forward(self, x)"))
    (tmp_path / "noinputs.py").write_text(GOOD.replace("def get_inputs():", "def inputs():"))
    (tmp_path / "rows.jsonl").write_text(json.dumps({"id": "row-a", "code": GOOD, "level": 1}) + "\n")
    ds = FolderDataset(FolderOptions(path=str(tmp_path)))
    tasks = {t.id: t for t in ds.tasks()}
    assert set(tasks) == {"level2/7_Good", "plain", "row-a"}
    assert tasks["level2/7_Good"].level == 2 and tasks["level2/7_Good"].name == "Good"
    assert tasks["row-a"].level == 1
    bad = {r.id: r.reason for r in ds.skipped}
    assert set(bad) == {"syntax", "noinputs"}
    assert "syntax error at line" in bad["syntax"] and "no get_inputs()" in bad["noinputs"]
    assert len(list(FolderDataset(FolderOptions(path=str(tmp_path), levels=[2])).tasks())) == 1
    with pytest.raises(ConfigError, match="needs a location"):
        list(FolderDataset(FolderOptions()).tasks())
