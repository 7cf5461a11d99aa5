"""Poisoned memory: uninitialised output shows up as NaN instead of an earlier result.

The harness cannot hand the candidate pre-filled output buffers, so uninitialised memory is
made visible instead, two ways, while the candidate runs in its process:

* :func:`fill_uninitialized`: torch's deterministic fill
  (``torch.utils.deterministic.fill_uninitialized_memory`` with deterministic algorithms in
  warn-only mode): every tensor made by ``empty``/``empty_like``/``empty_strided``/
  ``new_empty`` -- from Python or from C++ (``torch::empty``) -- starts as NaN (floating
  types) or the largest integer, so an output element the kernel never writes shows up;
* :func:`poison_allocator`: on CUDA, before each candidate run the caching allocator is
  emptied and large blocks (in all at least four times the inputs plus reference outputs, at
  most half the free memory) plus a set of small blocks are allocated, filled with 0xFF bytes
  (NaN in every float format) and freed, so memory the allocator hands out later -- also to
  code that bypasses the fill -- holds NaN rather than an earlier result. Once the run is
  over, :func:`release_cached` hands those blocks back to the driver: held in this process's
  cache they are memory the trusted process cannot allocate for the next input set (a task
  with 16 GiB inputs left the trusted side short of memory on an 80 GB GPU).

  The large blocks are many, each big enough for the reference's whole output
  (:func:`poison_plan`), not one: the allocator carves later allocations out of a cached
  block, and the driver takes back only a block with nothing left in it. An output carved
  out of one block of half the free memory kept all of it allocated after the run (an H200
  held 56 GiB of poison beside a 28 GiB input set, and the trusted side could not draw its
  next set); carved out of a block its own size, it keeps about its own size. An allocation
  larger than a block comes from the driver instead, unpoisoned; torch's tensors still
  start filled (the first way).

Memory obtained outside torch (a raw ``cudaMalloc`` in the kernel code) is not covered, but
such memory cannot be returned as a torch output without going through torch.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def fill_uninitialized() -> Iterator[None]:
    """NaN-fill every tensor torch creates uninitialised (see the module docstring)."""
    import warnings

    import torch

    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    det = getattr(torch.utils, "deterministic", None)
    was_fill = getattr(det, "fill_uninitialized_memory", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.use_deterministic_algorithms(True, warn_only=True)
        if det is not None:
            det.fill_uninitialized_memory = True
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(was_on, warn_only=was_warn)
            if det is not None and was_fill is not None:
                det.fill_uninitialized_memory = was_fill


SEGMENT = 2 << 20  # the caching allocator rounds large blocks to 2 MiB
MIN_BLOCK = 256 << 20  # the smallest large poisoned block
MAX_BLOCKS = 64  # at most this many large blocks (they grow past MIN_BLOCK to stay under it)


def poison_plan(size: int, output_bytes: int = 0) -> list[int]:
    """The sizes of the large blocks that poison ``size`` bytes: equal blocks, each big
    enough for an output of ``output_bytes`` (so that the output is carved out of one of
    them and, once the run is over, holds no more than that block), at least
    :data:`MIN_BLOCK` and no more than :data:`MAX_BLOCKS` of them; a rest smaller than a
    block is left out."""
    if size <= 0:
        return []
    block = max(int(output_bytes), -(-size // MAX_BLOCKS), MIN_BLOCK)
    block = -(-block // SEGMENT) * SEGMENT
    if block >= size:
        return [int(size)]
    return [block] * (size // block)


def poison_allocator(device: Any, nbytes_hint: int = 0, output_bytes: int = 0) -> int:
    """Fill the CUDA caching allocator's free memory with 0xFF bytes; returns bytes poisoned.
    ``nbytes_hint``: the inputs and outputs of the run ahead (the poison is four times that,
    at most half the free memory); ``output_bytes``: its outputs (see :func:`poison_plan`)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return 0
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info(dev)
    size = max(4 * nbytes_hint, MIN_BLOCK)
    size = int(min(size, free // 2))
    blocks = [torch.empty(b, dtype=torch.uint8, device=dev) for b in poison_plan(size, output_bytes)]
    # the small-block pool (allocations up to 1 MiB live in 2 MiB segments)
    blocks.extend(torch.empty(512 << 10, dtype=torch.uint8, device=dev) for _ in range(32))
    for b in blocks:
        b.fill_(0xFF)
    torch.cuda.synchronize(dev)
    total = sum(b.numel() for b in blocks)
    del blocks
    return total


def release_cached(device: Any) -> int:
    """After a run: hand every free block of the CUDA caching allocator (the poisoned ones
    among them) back to the driver; the output handed back stays allocated. Returns the
    bytes the driver took back (0 off CUDA): free space inside a block that still holds a
    tensor stays with this process and is not counted."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return 0
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_reserved(dev)
    torch.cuda.empty_cache()
    return max(0, int(before - torch.cuda.memory_reserved(dev)))
