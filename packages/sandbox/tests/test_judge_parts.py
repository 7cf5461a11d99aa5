"""The judge's parts one by one: what crosses from the candidate process is checked, inputs
rotate unpredictably, checksums tell outputs apart, the judged files are copied without
following links, and a job user's processes are swept."""

from __future__ import annotations

import mmap
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.sandbox.judge import identity, rotation, snapshot, tensors, wire  # noqa: E402


def test_wire_carries_json_and_descriptors_and_refuses_the_rest():
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        wire.send(a, {"op": "x", "n": 3}, [r])
        msg, fds = wire.recv(b, timeout=5)
        assert msg == {"op": "x", "n": 3} and len(fds) == 1
        os.write(w, b"ok")
        assert os.read(fds[0], 2) == b"ok"
        os.close(fds[0])
        a.sendall(b"\x00\x00\x00\x05[1,2]")  # JSON, but not an object
        with pytest.raises(wire.WireError, match="not a JSON object"):
            wire.recv(b, timeout=5)
        a.sendall(b"\xff\xff\xff\xff")  # larger than any message may be
        with pytest.raises(wire.WireError, match="bytes"):
            wire.recv(b, timeout=5)
        with pytest.raises(wire.WireError) as e:
            wire.recv(b, timeout=0.2)
        assert e.value.reason == "timeout"
        assert wire.floats({"s": [1, 2.5]}, "s", 2) == [1.0, 2.5]
        for bad in ([1, float("nan")], [1, True], "1,2", [1]):
            with pytest.raises(wire.WireError):
                wire.floats({"s": bad}, "s", 2)
    finally:
        a.close()
        b.close()
        os.close(r)
        os.close(w)


def test_outputs_come_back_as_sealed_copies_and_bad_descriptions_are_refused():
    out = (torch.randn(3, 5), {"k": torch.arange(4)}, 2.5, None)
    ex = tensors.Exporter()
    spec = ex.describe(out)
    got = tensors.rebuild(spec, ex.fds, "cpu")
    assert torch.equal(got[0], out[0]) and torch.equal(got[1]["k"], out[1]["k"]) and got[2:] == (2.5, None)
    assert isinstance(got, tuple)
    t = spec["items"][0]
    for change, match in (({"dtype": "object"}, "dtype"), ({"shape": [3, 6]}, "size"), ({"fd": 9}, "descriptor"),
                          ({"via": "cuda_ipc"}, "not possible")):
        with pytest.raises(tensors.WireError, match=match):
            tensors.rebuild({**t, **change}, ex.fds, "cpu")
    ex.release()
    # a buffer the candidate could still write to is not read
    fd = os.memfd_create("unsealed", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 60)
    with pytest.raises(tensors.WireError, match="not sealed"):
        tensors.rebuild({**t, "fd": 0}, [fd], "cpu")
    with mmap.mmap(fd, 60):
        pass
    os.close(fd)


def test_inputs_rotate_unpredictably_and_exactly():
    x = [[torch.randn(4, 4, dtype=torch.bfloat16), torch.tensor([1.5, 2.0])], [torch.randn(4, 4), torch.rand(2)]]
    rot = rotation.Rotation(7, [x[0]])
    work = [v.clone() for v in x[0]]
    rot.fill(3, work)
    assert all(torch.equal(a, b) for a, b in zip(work, rot.inputs(3)))
    assert not torch.equal(rot.inputs(1)[0], rot.inputs(3)[0])  # every visit of a set changes its inputs
    assert not torch.equal(rotation.Rotation(8, [x[0]]).inputs(3)[0], work[0])  # another seed, other inputs
    assert bool((work[1] > 0).all())  # an input of one sign keeps it


def test_a_large_input_is_rescaled_period_by_period_in_two_launches(monkeypatch):
    """Inputs longer than the factors' period (made short here): the broadcast product over
    whole periods gives, element by element, what one product per period gives."""
    monkeypatch.setattr(rotation, "PERIOD", 1009)
    m = rotation.PERIOD * 7 + 123
    p = torch.randn(m)
    rot = rotation.Rotation(11, [[p]])
    got = rot.inputs(5)[0]
    o = rot.offset(5, 0)
    r = rot._factors(torch.float32, True)
    want = torch.empty_like(p)
    for c in range(0, m, rotation.PERIOD):
        e = min(m, c + rotation.PERIOD)
        torch.mul(p[c:e], r[o:o + e - c], out=want[c:e])
    assert torch.equal(got, want)


def test_the_device_checksums_are_the_chunked_ones_summed_once(monkeypatch):
    """The GPU path of the checksums (norms and dot products per period into buffers, one
    float64 sum) agrees with the chunked CPU path and with the trusted side's expectation
    (the period made short, so that CPU float32 reductions are as exact as a GPU's)."""
    monkeypatch.setattr(rotation, "PERIOD", 1009)
    x = torch.randn(rotation.PERIOD * 9 + 432)
    c = rotation.Checksums(3)
    w = c.weights(x.numel())
    fast, chunked = c.slots(1)[0], c.slots(1)[0]
    c._into_cuda(x, w, fast)
    c.into(x, chunked)
    assert float(fast[0]) == pytest.approx(float(chunked[0]), rel=1e-5)
    assert float(fast[1]) == pytest.approx(float(chunked[1]), rel=1e-5, abs=1e-3)
    want = c.expected(x, 1e-2, 1e-2)
    assert c.mismatch(fast.tolist(), want) == ""
    wrong = c.slots(1)[0]
    c._into_cuda(x * 1.1, w, wrong)
    assert c.mismatch(wrong.tolist(), want) != ""


def test_checksums_accept_outputs_within_the_tolerance_and_refuse_others():
    ref = torch.relu(torch.randn(1000, 300))
    want, slack = rotation.checksum_bounds(ref, 1e-2, 1e-2)
    near = ref + (1e-2 + 1e-2 * ref.abs()) * (torch.rand_like(ref) * 2 - 1) * 0.99
    assert abs(rotation.checksum(near) - want) <= slack
    for wrong in (torch.zeros_like(ref), ref * (1 + 1 / 16), torch.relu(torch.randn(1000, 300)) * 1.3):
        assert abs(rotation.checksum(wrong) - want) > slack
    assert rotation.checksum((ref, [ref])) == pytest.approx(2 * rotation.checksum(ref), rel=1e-6)


def test_snapshots_copy_regular_files_and_refuse_links(tmp_path):
    src = tmp_path / "ws"
    (src / "kernels").mkdir(parents=True)
    (src / "model_new.py").write_text("x = 1\n")
    (src / "kernels" / "k.cu").write_text("// k\n")
    secret = tmp_path / "secret"
    secret.write_text("hash")
    (src / "kernels" / "leak.cu").symlink_to(secret)
    (src / "model.py").symlink_to(secret)
    snap = snapshot.take(src, ["model_new.py", "model.py", "missing.py"], ("kernels",))
    try:
        assert (snap.root / "model_new.py").read_text() == "x = 1\n" and (snap.root / "kernels" / "k.cu").exists()
        assert not (snap.root / "model.py").exists() and not (snap.root / "kernels" / "leak.cu").exists()
        assert "model.py" in snap.refused and "missing.py" not in snap.refused
        assert all("hash" not in p.read_text() for p in snap.root.rglob("*") if p.is_file())
    finally:
        snap.remove()


@pytest.mark.skipif(os.geteuid() != 0, reason="sweeping another user's processes needs root")
def test_a_job_users_processes_are_swept_also_in_new_sessions():
    uid = 58980  # below the builds' (59000..) and the jobs' (60000..) user ids: this test's own
    proc = subprocess.Popen(["sh", "-c", "setsid sleep 300 & sleep 300"], user=uid, group=uid, cwd="/")
    try:
        for _ in range(100):
            if len(identity.processes_of(uid)) >= 2:
                break
            __import__("time").sleep(0.05)
        assert len(identity.processes_of(uid)) >= 2
        assert identity.cpu_seconds(uid=uid)[1] >= 2
        assert identity.sweep(uid) >= 2
        proc.wait(timeout=10)
        assert identity.processes_of(uid) == []
    finally:
        proc.kill()


def test_each_input_set_is_given_in_the_tensors_of_the_one_before():
    """Verification's input sets sit at the same addresses, so a result memoised by address
    is caught on the second set whatever the allocator does."""
    import torch

    from cuda_agent.sandbox.judge.candidate_state import CandidateState, refilled

    st = CandidateState()
    a = refilled(st, [torch.randn(4, 3), 7])
    b = refilled(st, [torch.randn(4, 3), 7])
    assert b[0].data_ptr() == a[0].data_ptr() and b[1] == 7
    fresh = torch.randn(4, 3)
    assert torch.equal(refilled(st, [fresh.clone(), 7])[0], fresh)  # the new draw's values
    other = refilled(st, [torch.randn(5, 3), 7])  # another shape: its own tensors
    assert other[0].shape == (5, 3)
    wide = torch.randn(1, 3).expand(4, 3)
    st.held_inputs = [wide]
    assert refilled(st, [torch.randn(1, 3).expand(4, 3)])[0] is not wide  # shared memory: fresh tensors


def _bare_timer(overhead: dict):
    """A CandidateTimer with no session: one CPU input set of ones, the loop's own work
    estimated at ``overhead`` (and as small as that so far)."""
    from cuda_agent.sandbox.judge import timing

    timer = timing.CandidateTimer.__new__(timing.CandidateTimer)
    timer.set_seeds, timer.device, timer.full, timer.get_inputs, timer.meta = [1], "cpu", False, None, {}
    timer.wide = False
    timer.reference_at = lambda i, j: torch.ones(4)
    timer.pristine = lambda s: [torch.ones(4)]
    timer.overhead = dict(overhead)
    timer.own_floor = dict(overhead)
    return timer

def test_a_busy_hosts_own_work_estimate_rises_by_at_most_a_share_of_the_reported_calls(monkeypatch):
    """On the CPU backend the loop's own work is measured again after a failed clock check and
    the larger estimate kept, but only up to OWN_RISE of the loop's mean reported call above the
    one before (its fixed part not at all): a rise bounded by the own work itself (three times
    the kernel on a 2-core CI host) covered a report divided by 8."""
    import contextlib

    from cuda_agent.sandbox.isolation import hostlock
    from cuda_agent.sandbox.judge import timing

    timer = _bare_timer({"cpu": 1.2, "cpu_fixed": 4.0, "plain": 0.5})
    measured = {"cpu": 1.8, "cpu_fixed": 9.0, "plain": 0.4}  # the host grew busy
    monkeypatch.setattr(timing, "loop_overhead_ms", lambda *a, **k: dict(measured))
    monkeypatch.setattr(hostlock, "timing", contextlib.nullcontext)

    class Profiler:
        begin = loop = None

    # a report divided by 8 of a 0.44 ms kernel: 0.055 ms a call; the estimate may rise 0.0275 ms
    timer.measure_overhead(Profiler(), keep=max, rise_per_call=timing.OWN_RISE * 0.055)
    assert timer.overhead["cpu"] == pytest.approx(1.2 + 0.0275)
    assert timer.overhead["cpu_fixed"] == 4.0 and timer.overhead["plain"] == 0.5
    # what the recheck then sees: 720 calls that really spent 0.44 ms each are caught
    own = 720 * timer.overhead["cpu"] + timer.overhead["cpu_fixed"]
    why, info = timing.cpu_check([0.055] * 720, own + 720 * 0.44, own, 1, 1)
    assert why and info["unaccounted_ms"] > 250
    # on a host busy enough that every call waited 2.4 times its work for a core, the honest
    # kernel's wall samples are 1.056 ms: the caught loop is charged its share of the wall time
    cpu = own + 720 * 0.44
    why, info = timing.cpu_check([0.055] * 720, cpu, own, 1, 1, wall_ms=3.4 * cpu)
    assert "share of the loop's wall time" in why
    assert 720 * 0.055 + info["unaccounted_ms"] == pytest.approx(720 * 0.44 * 3.4, rel=1e-3)
    # an honest loop whose own work really rose is charged the rise past the bound, never refused
    timer.overhead = {"cpu": 1.2, "cpu_fixed": 4.0}
    timer.measure_overhead(Profiler(), keep=max, rise_per_call=timing.OWN_RISE * 0.44)
    assert timer.overhead["cpu"] == pytest.approx(1.42)
    # every measurement's smallest is kept beside the estimate: the plain estimate's 0.4 fell,
    # the others rose
    assert timer.own_floor == {"cpu": 1.2, "cpu_fixed": 4.0, "plain": 0.4}


def test_a_caught_loop_is_charged_against_the_smallest_estimate_of_the_loops_own_work():
    """Whether a CPU loop is caught is decided with the generous estimate of the loop's own
    work; what it is charged, with the smallest: where that work is three times the kernel
    (a ReLU's inputs and checksums), 8% too much of it hid a third of the calls' time and a
    report divided by 8 was timed at 0.39x the honest kernel on a busy CI host."""
    from cuda_agent.sandbox.judge import timing

    n, kernel, own_real = 700, 0.40, 1.20
    cpu = n * (kernel + own_real)  # what the job's processes really spent
    generous, floor = n * own_real * 1.08, n * own_real
    why, info = timing.cpu_check([kernel / 8] * n, cpu, generous, 1, 1)
    assert why and (n * kernel / 8 + info["unaccounted_ms"]) / n == pytest.approx(kernel - 0.08 * own_real)
    why, info = timing.cpu_check([kernel / 8] * n, cpu, generous, 1, 1, own_floor_ms=floor)
    assert why and (n * kernel / 8 + info["unaccounted_ms"]) / n == pytest.approx(kernel)
    assert info["overhead_cpu_floor_ms"] == pytest.approx(floor)
    # the floor never decides whether a loop is caught: an honest report stays uncharged
    why, info = timing.cpu_check([kernel] * n, cpu, generous, 1, 1, own_floor_ms=0.5 * floor)
    assert not why and "unaccounted_ms" not in info


def test_the_own_work_measured_once_the_candidate_is_warm_is_sized_by_time_and_mode(monkeypatch):
    """Once the candidate is warm the loop's own work is measured again for about
    OWN_TARGET_MS (a GB output checksummed costs milliseconds a call: 30 calls, not the timed
    loop's 82 three times over), in the plain mode only; the mode that synchronises every
    call keeps its estimate from before the load until a loop runs in it."""
    import contextlib

    from cuda_agent.sandbox.isolation import hostlock
    from cuda_agent.sandbox.judge import timing
    from cuda_agent.sandbox.judge.profilers import get_profiler

    timer = _bare_timer({"plain": 15.0, "sync_each": 16.0, "fixed": 1.0})
    assert timer.own_calls(82) == timing.NULL_CALLS  # 15 ms a call: 30 calls are 450 ms already
    timer.overhead["plain"] = 0.1
    assert timer.own_calls(82) == 82 and timer.own_calls(5000) == timing.OWN_CALLS  # small calls: as before
    timer.overhead["plain"] = 15.0
    seen = []

    def fake(*a, **k):
        seen.append((a[4], a[7]))
        return {"plain": 14.0, "fixed": 0.8} if "plain" in a[7] else {"sync_each": 17.0}

    monkeypatch.setattr(timing, "loop_overhead_ms", fake)
    monkeypatch.setattr(hostlock, "timing", contextlib.nullcontext)

    class Profiler:
        begin = loop = None

    timer.measure_overhead(Profiler(), keep=min, calls=timer.own_calls(82), modes=("plain",))
    assert seen[-1] == (timing.NULL_CALLS, ("plain",))
    assert timer.overhead == {"plain": 14.0, "sync_each": 16.0, "fixed": 0.8}  # sync_each kept
    timer.measure_overhead(Profiler(), keep=min, calls=30, modes=("sync_each",))
    assert timer.overhead["sync_each"] == 16.0 and timer.own_floor["sync_each"] == 16.0  # the smaller stands
    # a first measurement (nothing known yet) always measures every mode
    timer.overhead, timer.own_floor = {}, {}
    timer.measure_overhead(Profiler(), modes=("sync_each",))
    assert seen[-1][1] == timing.MODES

    # the real measurement on the CPU: only the modes asked for
    monkeypatch.undo()
    prof = get_profiler("wallclock", {"warmup_ms": 0.0, "target_ms": 2.0, "min_iters": 3})
    sets, ref = [[torch.ones(256)]], torch.ones(256)
    plain = timing.loop_overhead_ms(prof, sets, ref, "cpu", 12, modes=("plain",))
    assert set(plain) == {"plain", "fixed", "cpu", "cpu_fixed"} and plain["plain"] >= 0.0
    both = timing.loop_overhead_ms(prof, sets, ref, "cpu", 12)
    assert {"plain", "sync_each", "fixed"} <= set(both)


def test_poison_comes_in_blocks_each_big_enough_for_the_output_so_an_output_keeps_only_its_own():
    from cuda_agent.sandbox.judge.poisoning import MAX_BLOCKS, MIN_BLOCK, SEGMENT, poison_plan

    gib = 1 << 30
    # an H200's case: 55 GiB of poison, a 0.23 GiB output; one block would have kept all of it
    plan = poison_plan(55 * gib, int(0.23 * gib))
    assert len(plan) <= MAX_BLOCKS and len(set(plan)) == 1
    assert plan[0] % SEGMENT == 0 and plan[0] >= int(0.23 * gib) and plan[0] <= gib
    assert 55 * gib - plan[0] <= sum(plan) <= 55 * gib  # all but less than a block is poisoned
    # an output of 6.4 GB: every block holds it whole
    big = poison_plan(60 * gib, 6_400_000_000)
    assert all(b >= 6_400_000_000 for b in big) and len(big) == 60 * gib // big[0]
    # small runs: one block of the whole size; nothing to poison: no block
    assert poison_plan(MIN_BLOCK // 2, 1 << 20) == [MIN_BLOCK // 2]
    assert poison_plan(MIN_BLOCK, 0) == [MIN_BLOCK]
    assert poison_plan(0, 1 << 20) == []
    # an output larger than the poison: one block of the poison's size (the output comes
    # from the driver; torch's fill still starts it as NaN)
    assert poison_plan(2 * gib, 3 * gib) == [2 * gib]


def test_the_settings_two_timings_ran_under_are_compared_and_the_candidates_word_is_bounded():
    from cuda_agent.sandbox.judge.process_flags import MAX_KEYS, flags_differ, process_flags, sanitized

    here = process_flags("cpu")
    assert here["grad_enabled"] is True and here["uid"] == os.getuid() and "env:NVIDIA_TF32_OVERRIDE" in here
    other = dict(here, uid=here["uid"] + 1, nice=5, cudnn_benchmark=True, **{"env:CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert flags_differ(here, other) == {"cudnn_benchmark": [False, True],
                                         "env:CUDA_DEVICE_MAX_CONNECTIONS": [here["env:CUDA_DEVICE_MAX_CONNECTIONS"], "1"]}
    assert flags_differ(here, dict(here)) == {} and flags_differ(None, here) == {}
    said = {"ok": True, "x" * 100: 1, "nested": {"a": 1}, "long": "y" * 1000, **{f"k{i}": i for i in range(200)}}
    kept = sanitized(said)
    assert kept["ok"] is True and "nested" not in kept and len(kept["long"]) == 200
    assert not any(len(k) > 80 for k in kept) and len(kept) <= MAX_KEYS
    assert sanitized(["not", "a", "mapping"]) is None
