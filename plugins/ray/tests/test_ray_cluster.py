"""The ``ray`` executor on a real Ray cluster of this machine: a head and a second node, each
with one unit of a custom resource standing in for a GPU slot, CPU workers doing the work.

Checked: jobs spread over both nodes and never overlap on a slot, across two clients
(from the start and end each worker recorded); verification goes before profiling before
baselines; failing jobs end with the same reasons and
one-line messages as with the ``cpu`` executor; builds run as cluster tasks and baselines
are measured once for the cluster; killing the second node's raylet in the middle of a job
fails that job (``node_loss: fail``) or runs it again on the head (``retry``) while
finished jobs keep their results; ``eval --solutions`` through ``ray`` equals one through
``cpu``. The cluster's processes are ended by PID at the end. The cluster starts and works
beside a stray Ray token in the home folder (``conftest.py``).
"""

from __future__ import annotations

import json
import textwrap
import time
from concurrent.futures import wait
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from cuda_agent.core.types import Task  # noqa: E402
from cuda_agent.sandbox.executors import CpuExecutor, Job, JobError  # noqa: E402
from cuda_agent.sandbox.executors.local import CpuExecutorOptions  # noqa: E402
from cuda_agent_ray.executor import RayExecutor, RayExecutorOptions  # noqa: E402
from cuda_agent_ray.localcluster import LocalCluster  # noqa: E402

pytestmark = pytest.mark.xdist_group("ray-cluster")  # one cluster per test process

SLOT = "cuda_agent_slot"
S = "cuda_agent.sandbox.executors.selftest:"
LIGHT = {"spares": 0, "preload": [], "warm_plugins": False, "prestart": False}  # workers that start fast: probe jobs only


@pytest.fixture(scope="module")
def cluster(foreign_home):
    c = LocalCluster(head_resources={SLOT: 1})
    c.start()
    try:
        c.add_node({SLOT: 1})
        with pytest.MonkeyPatch.context() as mp:  # this process is one of the cluster's clients
            for key, value in c.client_env.items():
                mp.setenv(key, value)
            yield c
    finally:
        c.stop()
    for node in c.nodes:  # every process the cluster started is gone
        assert not node.processes(), [p.pid for p in node.processes()]


@pytest.fixture()
def pools(cluster):
    made: list[RayExecutor] = []

    def make(namespace: str, pool: dict | None = None, **options) -> RayExecutor:
        ex = RayExecutor(RayExecutorOptions(address=cluster.address, node_ip_address=cluster.head_ip, backend="cpu",
                                            namespace=namespace, pool=dict(LIGHT if pool is None else pool),
                                            **options))
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.close()
    for namespace in {ex.options.namespace for ex in made}:  # frees the slots for the next test
        ender = RayExecutor(RayExecutorOptions(address=cluster.address, node_ip_address=cluster.head_ip,
                                               backend="cpu", namespace=namespace))
        ender.shutdown_pool()
        ender.close()


def overlaps(intervals: list[tuple[float, float]]) -> list[tuple]:
    spans = sorted(intervals)
    return [(a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1]]


def test_overlap_check_sees_an_overlap():
    assert overlaps([(0.0, 1.0), (2.0, 3.0)]) == []
    assert overlaps([(0.0, 1.0), (0.5, 3.0)]) == [((0.0, 1.0), (0.5, 3.0))]


def test_jobs_spread_over_both_nodes_one_at_a_time_per_slot(pools, cluster):
    a, b = pools("spread"), pools("spread")  # two clients of one pool
    assert sorted(a.devices) == ["127.0.0.2/cpu0", "127.0.0.3/cpu0"] == sorted(b.devices)
    futs = [ex.submit(Job(S + "sleep", {"seconds": 0.3, "value": f"{name}{i}"}))
            for i in range(4) for name, ex in (("a", a), ("b", b))]
    wait(futs, timeout=120)
    runs: dict[str, list[tuple[float, float]]] = {}
    clients_on: dict[str, set] = {}
    for f in futs:
        r = f.result()
        runs.setdefault(r["worker"], []).append((r["start"], r["end"]))  # taken inside the worker
        clients_on.setdefault(r["worker"], set()).add(r["value"][0])
        assert f.record.status == "ok" and f.record.device in a.devices and f.record.node_ip in r["worker"]
    assert sorted(runs) == ["ray-127.0.0.2-cpu0", "ray-127.0.0.3-cpu0"]
    for worker, spans in runs.items():
        assert len(spans) >= 2 and overlaps(spans) == [], (worker, spans)
    assert any(len(c) == 2 for c in clients_on.values()), clients_on  # a slot served both clients
    assert a.stats()["busy_answers"] + b.stats()["busy_answers"] > 0  # they did ask for one slot at once
    stats = a.stats()
    assert stats["nodes"] == ["127.0.0.2", "127.0.0.3"] and stats["results"]["ok"] == 4


def test_queue_order_verification_before_profiling_before_baselines(pools):
    ex = pools("order")
    assert len(ex.devices) == 2
    blockers = [ex.submit(Job(S + "sleep", {"seconds": s})) for s in (1.0, 2.0)]  # both slots busy
    time.sleep(0.3)
    queued = {kind: ex.submit(Job(S + "echo", {"value": kind}, kind=kind)) for kind in ("baseline", "profile", "verify")}
    wait([*blockers, *queued.values()], timeout=120)
    accepted = {kind: f.record.slot_record["accepted_wall"] for kind, f in queued.items()}  # when a slot took it
    assert accepted["verify"] < accepted["profile"] < accepted["baseline"], accepted
    assert all(f.result()["value"] == kind for kind, f in queued.items())


def test_failing_jobs_end_as_with_the_cpu_executor(pools):
    probes = [("segfault", {}, None), ("abort", {}, None), ("hang", {}, 2.0), ("fail", {"message": "boom"}, None),
              ("exit_code", {"code": 3}, None)]

    def outcomes(ex) -> list[tuple[str, str]]:
        out = []
        for fn, kw, timeout in probes:
            try:
                ex.run(Job(S + fn, kw, timeout=timeout))
                out.append(("ok", ""))
            except JobError as exc:
                out.append((exc.reason, str(exc)))
            assert ex.run(Job(S + "echo", {"value": 1}))["value"] == 1  # the pool keeps serving
        return out

    local = CpuExecutor(CpuExecutorOptions(**LIGHT))
    try:
        want = outcomes(local)
    finally:
        local.close()
    got = outcomes(pools("probes"))
    assert [r for r, _ in want] == ["crash", "crash", "timeout", "exception", "crash"]
    assert got == want


TASK = textwrap.dedent(
    """
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, a, b):
            return a + b


    def get_inputs():
        return [torch.randn(262144), torch.randn(262144)]  # calls long enough that a busy host adds little


    def get_init_inputs():
        return []
    """
)


def _eval_cpu_cases():
    """The candidates of the evaluation package's CPU end-to-end test (one text for both tests)."""
    import importlib.util

    path = Path(__file__).resolve().parents[3] / "packages" / "evaluation" / "tests" / "test_eval_cpu.py"
    spec = importlib.util.spec_from_file_location("_eval_cpu_cases", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


CASES = _eval_cpu_cases()
MODEL_NEW, KERNEL = CASES.MODEL_NEW, CASES.KERNEL


def test_builds_on_the_cluster_and_baselines_measured_once(pools, tmp_path):
    from cuda_agent.sandbox.workspace.workspace import create_workspace

    ex = pools("baselines", pool={"spares": 0, "warm_plugins": False}, builds="ray",
               baseline_cache_dir=str(tmp_path / "head-cache"))
    ws = create_workspace(Task(id="add", source="test", code=TASK), tmp_path / "ws", backend="cpu")
    (ws.root / "kernels" / "add.cpp").write_text(KERNEL.format(fn="add", expr="a[i] + b[i]"))
    (ws.root / "model_new.py").write_text(MODEL_NEW.format(fn="add"))
    from cuda_agent.sandbox.workspace.service import WorkspaceService

    svc = WorkspaceService(ws, executor=ex)  # its compile step goes to ex.build_executor()
    t0 = time.monotonic()
    c = svc.compile()
    assert c.ok, c.errors
    print(f"build on the cluster: {time.monotonic() - t0:.1f} s (pool start included: {ex.devices})")
    assert Path(c.artifact).parent == ws.root / ".cuda_agent" / "build" and Path(c.artifact).is_file()
    builds = ex.build_executor()
    assert builds.built_on and builds.built_on[0].startswith("127.0.0.")  # a cluster node built it
    again = svc.compile()
    assert again.ok and again.cached and len(builds.built_on) == 2  # the build travelled: up to date there
    svc.close()

    # one attempt per timing: a busy host would otherwise retake every timing up to three times
    opts = {"compile_baseline": False, "num_input_sets": 1, "attempts": 1,
            "baseline_cache_dir": str(tmp_path / "client-cache")}
    futs = [ex.submit(Job("cuda_agent.sandbox.judge.tasks:profile", {"workspace": str(ws.root), "options": opts},
                          kind="profile", timeout=300)) for _ in range(2)]
    t0 = time.monotonic()
    wait(futs, timeout=300)
    print(f"two profile jobs: {time.monotonic() - t0:.1f} s")
    results = [f.result() for f in futs]
    assert all(p.ok for p in results), [p.message for p in results]
    assert sorted(f.record.device for f in futs) == ["127.0.0.2/cpu0", "127.0.0.3/cpu0"]
    assert sorted(p.metadata["baseline_cache"] for p in results) == ["hit", "miss"]  # measured once, by one node
    leases = sorted(f.record.slot_record["baseline_lease"] for f in futs)
    assert leases in (["done", "granted"], ["granted", "granted"]), leases
    store = ex.store_info()
    assert store["records"] == 1 and store["dir"] == str(tmp_path / "head-cache")
    assert len(list((tmp_path / "head-cache").glob("*/*.json"))) == 1  # kept on the head's disk
    assert not (tmp_path / "client-cache").exists()  # the cluster's cache, not the client's folder


# --- eval --solutions through ray equals one through cpu ------------------------------------


def _task(body: str) -> str:
    return TASK.replace("return a + b", f"return {body}")


EXPECTED = CASES.EXPECTED


def _solutions(tmp: Path) -> None:
    kb = tmp / "kb" / "level1"
    kb.mkdir(parents=True)
    for name, body in {"1_Add": "a + b", "2_Sub": "a - b", "3_Mul": "a * b", "4_Max": "torch.maximum(a, b)",
                       "5_Min": "torch.minimum(a, b)"}.items():
        (kb / f"{name}.py").write_text(_task(body))
    sols = tmp / "solutions"
    CASES.workspace_solution(sols, "L1__1_Add", "add", "a[i] + b[i]")  # correct
    CASES.workspace_solution(sols, "L1__2_Sub", "sub", "a[i] + b[i]")  # wrong result
    CASES.workspace_solution(sols, "L1__4_Max", "vmax", "a[i] > b[i] ? a[i] : b[i]", broken=True)  # no build
    (sols / "level1").mkdir()
    (sols / "level1" / "3_Mul.py").write_text(CASES.FORBIDDEN)  # single-file form, a torch op


def test_eval_solutions_through_ray_equals_cpu(cluster, tmp_path, monkeypatch):
    from cuda_agent.core.config import compose
    from cuda_agent.core.plugins import reset_plugin_manager
    from cuda_agent.evaluation.evaluate import evaluate

    _solutions(tmp_path)
    monkeypatch.setenv("CUDA_AGENT_PLUGINS", "ray")
    reset_plugin_manager()
    common = [
        "eval.dataset.name=kernelbench", f"eval.dataset.options.root={tmp_path / 'kb'}",
        f"eval.solutions={tmp_path / 'solutions'}", "backend=cpu", "eval.workers=2", "logging.console=false",
        "eval.progress=false", "eval.profile.options.baselines=false",
        "eval.profile.options.attempts=1", "eval.profile.options.num_input_sets=1",  # one timing each: a busy host
    ]
    ray_exec = [
        "executor.name=ray", f"executor.options.address={cluster.address}", "executor.options.backend=cpu",
        f"executor.options.node_ip_address={cluster.head_ip}", "executor.options.namespace=eval",
        "executor.options.builds=ray", "executor.options.pool.warm_plugins=false",
    ]
    try:
        reports = {}
        for name, ex in (("cpu", ["executor.name=cpu", "executor.options.recycle=on_error"]), ("ray", ray_exec)):
            t0 = time.monotonic()
            out = evaluate(compose([], [*common, *ex, f"run.output_dir={tmp_path / 'runs' / name}"]))
            print(f"eval through {name}: {time.monotonic() - t0:.1f} s")
            reports[name] = out["report"]
        table = {name: {t["task_id"]: (t["failure"], t["correct"], t["t_candidate_ms"] is not None)
                        for t in rep["tasks"]} for name, rep in reports.items()}
        messages = {name: {t["task_id"]: t.get("message") for t in rep["tasks"]} for name, rep in reports.items()}
        assert table["ray"] == table["cpu"], json.dumps([table, messages], indent=1)
        assert {k: v[0] for k, v in table["ray"].items()} == EXPECTED, messages
        assert reports["ray"]["metrics"]["overall"]["n_correct"] == 1
        assert reports["ray"]["environment"]["executor"].startswith("ray (2 device(s))")
    finally:
        ender = RayExecutor(RayExecutorOptions(address=cluster.address, node_ip_address=cluster.head_ip,
                                               backend="cpu", namespace="eval"))
        ender.shutdown_pool()
        ender.close()
        monkeypatch.delenv("CUDA_AGENT_PLUGINS")
        reset_plugin_manager()


# --- node loss (last: it leaves the cluster with the head alone) ----------------------------


def _busy_pair(ex: RayExecutor, marks: Path, seconds: float) -> tuple[list, dict]:
    """Two long jobs, one per slot; returns them and {node_ip: future} once both have started."""
    futs = [ex.submit(Job(S + "record", {"path": str(marks), "value": i, "seconds": seconds}, timeout=120))
            for i in range(2)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        started = marks.read_text().split() if marks.exists() else []
        if len(started) == 2 and all(f.record.node_ip for f in futs):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the two jobs did not start")
    return futs, {f.record.node_ip: f for f in futs}


def test_node_loss_fails_the_job_or_runs_it_again(pools, cluster, tmp_path):
    # node_loss: fail -- the job on the lost node fails with a clear error; the others are kept
    ex = pools("loss", node_loss="fail")
    done_before = ex.run(Job(S + "echo", {"value": "before"}))
    futs, by_node = _busy_pair(ex, tmp_path / "marks1", 4.0)
    node2 = next(n for n in cluster.nodes if n.ip == "127.0.0.3")
    t0 = time.monotonic()
    node2.kill_raylet()
    with pytest.raises(JobError) as info:
        by_node["127.0.0.3"].result(timeout=60)
    err = info.value
    assert err.reason == "node_lost" and err.failure.value == "infra_error"
    assert str(err).startswith("the node 127.0.0.3 left the cluster while it ran the job (slot 127.0.0.3/cpu0)")
    assert "not retried (executor.options.node_loss=fail)" in str(err) and "\n" not in str(err)
    assert time.monotonic() - t0 < 30
    assert by_node["127.0.0.2"].result(timeout=60)["value"] in (0, 1)  # the head's job finished
    assert done_before["value"] == "before"
    assert ex.devices == ["127.0.0.2/cpu0"]
    node2.stop()

    # a new node joins; node_loss: retry -- the lost job runs again on the head and succeeds
    node3 = cluster.add_node({SLOT: 1})
    ex2 = pools("loss", node_loss="retry")  # node_loss is the client's: same slots, other policy
    assert sorted(ex2.devices) == ["127.0.0.2/cpu0", "127.0.0.4/cpu0"]
    futs, by_node = _busy_pair(ex2, tmp_path / "marks2", 3.0)
    node3.kill_raylet()
    lost = by_node["127.0.0.4"]
    assert lost.result(timeout=120)["value"] in (0, 1)
    assert lost.record.lost_on == ["127.0.0.4/cpu0"] and lost.record.device == "127.0.0.2/cpu0"
    assert lost.record.attempts == 2
    assert (tmp_path / "marks2").read_text().split().count(str(lost.result()["value"])) == 2  # it ran twice
    assert by_node["127.0.0.2"].result(timeout=60)["value"] in (0, 1)
    node3.stop()
