"""What makes every timed call's inputs new, and ties each call to its output, so that the
trusted side can check timed work.

**Inputs** (:class:`Rotation`, untimed, before each call). Call ``j`` of a timing runs on
input set ``j % k``, rewritten in place (the set's tensors keep their addresses, so a
captured CUDA graph replays on the new values):

* a task whose tensor inputs are all floating-point: every element of the set's pristine
  copy times a factor of its own, ``pristine[i] * R[i + o]``. ``R`` is a random buffer made
  from the seed the trusted side sends with the loop (magnitudes uniform in [0.5, 1); a
  random sign where the input holds both signs, its own sign where it holds one), periodic
  with a prime period (:data:`PERIOD`); the offset ``o`` is new for every call of a set. So
  no two calls' inputs are related by a scalar or an additive shift (nothing rescales or
  shifts a kept result into the next one), zeros stay zeros, magnitudes never grow and an
  input of one sign keeps it;
* a task with a tensor input that is not floating-point (indices, masks): a fresh
  ``get_inputs()`` draw per call, from a seed derived from the loop's seed and the call.

The candidate process knows the seed once the loop starts, and so each call's inputs: the
point is that no earlier output helps with the next one, and that nothing can be computed
before the loop (the trusted clock sees all time spent within it).

**Checksums** (:class:`Checksums`, untimed, after each call, queued on the device). Per call
four float64 numbers: the sum of squares of the output's finite elements; a weighted sum of
them, each element weighted by a random +-1 (periodic with :data:`PERIOD`); and, when the
reference's output is not finite everywhere (``full``), a fingerprint of where the NaN, +Inf
and -Inf elements are (random integer weights times 1, 2 or 3) and their count. The trusted
side recomputes them (:meth:`Checksums.expected`) for calls it picks after the loop: the
sum of squares within what the tolerance lets every element move; the weighted sum within
what it lets them move *statistically* (Hoeffding: an output within the tolerance whose
errors do not follow the weights moves it by more than :data:`Z` standard bounds with
probability below ``2 exp(-Z^2/2)``), which a stale, skipped or partly computed output
misses by the square root of the number of wrong elements; the fingerprint and count exactly.
Sums of squares are float32 reductions per chunk, added in float64; where the reference holds
elements past :data:`WIDE_ABOVE` in magnitude (``wide``), whose squares would overflow a float32
sum, each chunk is reduced in float64. An output already in float64 (or an integer or boolean
output, widened to it) is always reduced in float64.

**Random ops** (:meth:`Rotation.seed_call`). Before call ``j`` torch's generators are seeded
from the loop's seed and ``j`` on both sides, so that a task whose model draws random numbers
(dropout in training mode) computes the same output for call ``j`` in the candidate process as
the reference does on the trusted side.
"""

from __future__ import annotations

import math
from typing import Any

_MASK = (1 << 64) - 1
PERIOD = 16777213  # a prime (2**24 - 3): the period of input factors and checksum weights
OFFSETS = 1 << 16  # a call's factor offset is one of these
BLOCK = 1 << 20  # random buffers are made in blocks of their own seed (any length, same prefix)
CHUNK = 1 << 26  # elements per float32 norm of a checksum on a GPU
DOT_CHUNK = 1 << 16  # elements per float32 dot product of a checksum on the CPU
# the float32 rounding a chunk's dot product can carry, relative (a bound, not a typical value)
DOT_ROUNDING = DOT_CHUNK * 2.0 ** -23
GPU_ROUNDING = 1e-4  # a float32 tree reduction on a GPU, relative (generous)
# a float32 dot product of signed terms, relative to the sum of their magnitudes: the largest
# error of reductions that add at most 64 terms in a row (measured: about 1e-8 on the CPU)
WEIGHTED_ROUNDING = 2.0 ** -18
Z = 7.0  # standard bounds of the weighted sum's slack (false refusal below 1e-10 a check)
FAST, WIDTH = 2, 4  # statistics filled without and with the non-finite fingerprint; per call
POSITION_WEIGHTS = 1 << 16  # fingerprint weights 1 .. 2**16 (sums stay exact in float64)
# a reference element past this magnitude makes the checksums' sums of squares float64 per chunk:
# a float32 sum of CHUNK squares of up to about 1.4x this stays below float32's largest number
WIDE_ABOVE = 1e15


def _mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def derived(seed: int, *parts: int) -> int:
    """A 62-bit seed derived from ``seed`` and ``parts``."""
    x = _mix(seed & _MASK)
    for p in parts:
        x = _mix(x ^ _mix(p & _MASK))
    return x & ((1 << 62) - 1)


def _random(seed: int, tag: int, length: int, device: Any, kind: str) -> Any:
    """``length`` values from ``seed`` (blocks of :data:`BLOCK`, each generator seeded on its
    own: the same prefix whatever the length). ``kind``: ``factor`` (float32, magnitudes in
    [0.5, 1), random signs), ``sign`` (float32 +-1) or ``position`` (float64 integers
    1 .. :data:`POSITION_WEIGHTS`)."""
    import torch

    dev = torch.device(device)
    gen = torch.Generator(device=dev)
    parts = []
    for b in range(0, length, BLOCK):
        m = min(BLOCK, length - b)
        gen.manual_seed(derived(seed, tag, b // BLOCK))
        if kind == "position":
            parts.append(torch.randint(1, POSITION_WEIGHTS + 1, (m,), generator=gen, device=dev).to(torch.float64))
            continue
        v = torch.rand(m, generator=gen, device=dev).mul_(2.0).sub_(1.0)  # [-1, 1)
        sign = torch.where(v < 0, -1.0, 1.0)
        parts.append(sign if kind == "sign" else sign.mul_(v.abs_().mul_(0.5).add_(0.5)))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _float_tensor(v: Any) -> bool:
    import torch

    return isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0


def draws_fresh(values: list) -> bool:
    """Whether a task with inputs ``values`` gets a fresh ``get_inputs()`` draw per timed
    call (it has a tensor input that is not floating-point: no factor can make it new)."""
    import torch

    return any(isinstance(v, torch.Tensor) and not v.is_floating_point() and v.numel() > 0 for v in values)


class Rotation:
    """Call ``j``'s inputs (see the module docstring), on both sides: :meth:`fill` rewrites a
    set's tensors in place (the candidate process), :meth:`inputs` makes fresh ones (the
    trusted side). ``pristine``: the input sets; ``get_inputs``: the task's, for tasks that
    draw fresh (:func:`draws_fresh`)."""

    def __init__(self, seed: int, pristine: list, get_inputs: Any = None, device: Any = "cpu"):
        self.seed = int(seed)
        self.pristine = pristine
        self.k = max(1, len(pristine))
        self.get_inputs = get_inputs
        self.device = device
        self.fresh = bool(pristine) and draws_fresh(pristine[0]) and get_inputs is not None
        self._signs: dict[int, list] = {}
        self._buffers: dict[tuple, Any] = {}
        self._gpu: int | None = None  # the GPU whose generator seed_call seeds (-1: none)
        self.base = derived(self.seed, 1) % OFFSETS
        self.step = (derived(self.seed, 2) % OFFSETS) | 1  # odd: a set's offsets differ for 2**14 visits

    def offset(self, j: int, t: int) -> int:
        return (self.base + j * self.step + t * 7919) % OFFSETS

    def draw_seed(self, j: int) -> int:
        return derived(self.seed, 3, j) & 0x7FFFFFFF

    def seed_call(self, j: int) -> None:
        """Seed torch's default generators (the CPU's and, on a GPU, the device's) for call
        ``j``: random ops of the call (dropout) then draw the same numbers in the candidate
        process as in the reference on the trusted side. The generators are seeded directly
        (about 1 us each): ``torch.manual_seed`` formats a stack trace for every lazily
        seeded backend, 60 us a call."""
        import torch

        s = derived(self.seed, 4, j) & 0x7FFFFFFF
        torch.default_generator.manual_seed(s)
        if self._gpu is None:  # the device's generator, found once (this runs before every timed call)
            dev = torch.device(self.device)
            self._gpu = -1 if dev.type != "cuda" else (dev.index if dev.index is not None else torch.cuda.current_device())
        if self._gpu >= 0:
            gens = torch.cuda.default_generators
            if self._gpu < len(gens):
                gens[self._gpu].manual_seed(s)
            else:  # CUDA not initialised yet in this process
                torch.cuda.manual_seed(s)

    def _mixed(self, i: int) -> list:
        """Per tensor of set ``i``: whether it holds both signs (its factors then get random signs)."""
        if i not in self._signs:
            self._signs[i] = [bool((p < 0).any()) and bool((p > 0).any()) if _float_tensor(p) else False
                              for p in self.pristine[i]]
        return self._signs[i]

    def prepare(self) -> None:
        """Make the factor buffers ahead of the first call."""
        if self.fresh:
            return
        for i in range(self.k):
            for p, mixed in zip(self.pristine[i], self._mixed(i)):
                if _float_tensor(p):
                    self._factors(p.dtype, mixed)

    def _factors(self, dtype: Any, mixed: bool) -> Any:
        key = (dtype, mixed)
        if key not in self._buffers:
            import torch

            if ("base",) not in self._buffers:
                longest = max((p.numel() for s in self.pristine for p in s if _float_tensor(p)), default=1)
                self._buffers[("base",)] = _random(self.seed, 10, min(PERIOD, longest) + OFFSETS, self.device, "factor")
            r = self._buffers[("base",)]
            r = r if mixed else r.abs()
            self._buffers[key] = r if dtype == torch.float32 else r.to(dtype)
        return self._buffers[key]

    def _scaled(self, p: Any, o: int, mixed: bool, out: Any) -> None:
        import torch

        m = p.numel()
        r = self._factors(p.dtype, mixed)
        if p.is_contiguous() and out.is_contiguous():
            # whole periods as rows of one broadcast product, then the rest: two launches
            # whatever the size (the host's work per timed call stays below the device's)
            pf, of = p.view(-1), out.view(-1)
            whole = m - m % PERIOD
            if whole:
                torch.mul(pf[:whole].view(-1, PERIOD), r[o:o + PERIOD], out=of[:whole].view(-1, PERIOD))
            if m > whole:
                torch.mul(pf[whole:], r[o:o + m - whole], out=of[whole:])
            return
        parts = [r[o:o + min(PERIOD, m - c)] for c in range(0, m, PERIOD)]  # strided tensors: a whole factor
        f = (torch.cat(parts) if len(parts) > 1 else parts[0]).view(p.shape)
        torch.mul(p, f, out=out)

    def _drawn(self, j: int) -> list:
        from .inputs import draw_inputs

        return draw_inputs(self.get_inputs, self.draw_seed(j), self.device).values

    def fill(self, j: int, work: list) -> None:
        """Rewrite ``work`` (the tensors of set ``j % k``) with call ``j``'s inputs, and seed
        the generators for the call (:meth:`seed_call`)."""
        import torch

        i = j % self.k
        if self.fresh:
            new = self._drawn(j)
            if len(new) != len(work):
                raise RuntimeError("get_inputs() returned another number of inputs for another seed")
            for w, v in zip(work, new):
                if isinstance(w, torch.Tensor):
                    if not isinstance(v, torch.Tensor) or v.shape != w.shape or v.dtype != w.dtype:
                        raise RuntimeError("get_inputs() returned inputs of another shape or dtype for another seed")
                    w.copy_(v)
        else:
            for t, (p, w, mixed) in enumerate(zip(self.pristine[i], work, self._mixed(i))):
                if _float_tensor(p):
                    self._scaled(p, self.offset(j, t), mixed, w)
        self.seed_call(j)

    def inputs(self, j: int) -> list:
        """Fresh tensors holding call ``j``'s inputs (the generators are not seeded: call
        :meth:`seed_call` right before the call)."""
        import torch

        if self.fresh:
            return self._drawn(j)
        i = j % self.k
        out = []
        for t, (p, mixed) in enumerate(zip(self.pristine[i], self._mixed(i))):
            if _float_tensor(p):
                w = torch.empty_like(p)
                self._scaled(p, self.offset(j, t), mixed, w)
                out.append(w)
            else:
                out.append(p.clone() if isinstance(p, torch.Tensor) else p)
        return out


def _tensors(obj: Any) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    return []


def _flat(t: Any) -> Any:
    import torch

    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if not t.is_floating_point():
        t = t.to(torch.float64)
    return t.reshape(-1)


def _split_nonfinite(flat: Any) -> tuple[Any, Any]:
    """(``flat`` with NaN/Inf as 0, a code that is 1 where NaN, 2 where +Inf, 3 where -Inf and 0
    elsewhere, in float64): a finite ``x`` minus itself is exactly 0."""
    import torch

    clean = torch.nan_to_num(flat, nan=0.0, posinf=0.0, neginf=0.0)
    code = torch.nan_to_num(flat, nan=1.0, posinf=2.0, neginf=3.0).sub_(clean)
    return clean, code.to(torch.float64)


class Checksums:
    """The per-call statistics of timed outputs (see the module docstring), made from the
    loop's ``seed`` on ``device``: :meth:`into` on the candidate side, :meth:`expected` on the
    trusted side. ``full``: also the fingerprint of non-finite elements (the finite part is
    summed then); ``wide``: sums of squares reduced in float64 (see :data:`WIDE_ABOVE`)."""

    def __init__(self, seed: int, device: Any = "cpu", full: bool = False, wide: bool = False):
        self.seed = int(seed)
        self.device = device
        self.full = bool(full)
        self.wide = bool(wide)
        self._w: Any = None
        self._w_as: dict = {}
        self._pos: Any = None

    def weights(self, length: int) -> Any:
        length = min(PERIOD, max(1, length))
        if self._w is None or self._w.numel() < length:
            self._w = _random(self.seed, 20, length, self.device, "sign")
            self._w_as = {}
        return self._w

    def _weights_as(self, length: int, dtype: Any) -> Any:
        w = self.weights(length)
        if w.dtype == dtype:
            return w
        if dtype not in self._w_as:
            self._w_as[dtype] = w.to(dtype)
        return self._w_as[dtype]

    def positions(self, length: int) -> Any:
        length = min(PERIOD, max(1, length))
        if self._pos is None or self._pos.numel() < length:
            self._pos = _random(self.seed, 21, length, self.device, "position")
        return self._pos

    def prepare(self, longest: int) -> None:
        """Make the weights ahead of the loop (``longest``: elements of the largest output tensor)."""
        self.weights(longest)
        if self.full:
            self.positions(longest)

    def into(self, obj: Any, row: Any) -> None:
        """Add ``obj``'s statistics to ``row`` (a float64 vector of :data:`WIDTH`; queued on
        the device, nothing waits for it)."""
        import torch

        for t in _tensors(obj):
            flat = _flat(t)
            if flat.numel() == 0:
                continue
            if flat.dtype not in (torch.float32, torch.float64):
                flat = flat.to(torch.float32)
            w = self._weights_as(flat.numel(), flat.dtype)
            pos = self.positions(flat.numel()) if self.full else None
            if flat.is_cuda and pos is None and not self.wide:
                self._into_cuda(flat, w, row)
                continue
            for c in range(0, flat.numel(), PERIOD):  # chunk by chunk: temporaries of a chunk's size
                seg = flat[c:c + PERIOD]
                if pos is not None:
                    seg, code = _split_nonfinite(seg)
                    row[2].add_(torch.dot(code, pos[:seg.numel()]))
                    row[3].add_(code.clamp(max=1.0).sum())  # the count (codes are 0..3; count_nonzero is slow)
                    del code
                _sum_of_squares_into(seg, row[0], self.wide)
                row[1].add_(torch.dot(seg, w[:seg.numel()]).to(torch.float64))

    def _into_cuda(self, flat: Any, w: Any, row: Any) -> None:
        """:meth:`into` for a finite check on a GPU: the same reductions as on the CPU path's
        chunks (a float32 norm and a dot product per :data:`PERIOD`), each written into a
        buffer and summed in float64 once, so that a call costs the host two launches a chunk
        and four more, not seven a chunk (a timed loop whose untimed work is host-bound hides
        from the trusted clock the device time a report leaves out)."""
        import torch

        n = flat.numel()
        chunks = -(-n // PERIOD)
        norm_dtype = _norm_dtype(flat)
        norms = torch.empty(chunks, dtype=norm_dtype, device=flat.device)
        dots = torch.empty(chunks, dtype=flat.dtype, device=flat.device)
        for i, c in enumerate(range(0, n, PERIOD)):
            seg = flat[c:c + PERIOD]
            torch.linalg.vector_norm(seg, dtype=norm_dtype, out=norms[i])
            torch.dot(seg, w[:seg.numel()], out=dots[i])
        row[0].add_(norms.to(torch.float64).square_().sum())
        row[1].add_(dots.to(torch.float64).sum())

    def slots(self, n: int) -> Any:
        import torch

        return torch.zeros((n, WIDTH), dtype=torch.float64, device=self.device)

    def expected(self, ref: Any, atol: float, rtol: float) -> dict:
        """The reference's statistics and how far an output within the tolerance may put each
        from it: ``{"finite", "sum_of_squares", "sum_of_squares_slack", "weighted_sum",
        "weighted_sum_slack", "fingerprint", "nonfinite", "largest"}`` (``largest``: the largest
        magnitude of a finite element)."""
        import torch

        tensors = _tensors(ref)
        on_gpu = bool(tensors and tensors[0].is_cuda)
        sq = sq_slack = ws = mag = fp = count = big = 0.0
        classes: Any = None  # per weight class: the largest sum of moves its elements can make
        for t in tensors:
            flat = _flat(t)
            for c in range(0, flat.numel(), PERIOD):
                r = flat[c:c + PERIOD].to(torch.float64)
                fin = torch.isfinite(r)
                if not bool(fin.all()):
                    r, code = _split_nonfinite(r)
                    fp += float(torch.dot(code, self.positions(flat.numel())[:r.numel()]))
                    count += float(code.clamp(max=1.0).sum())
                e = torch.where(fin, atol + rtol * r.abs(), torch.zeros((), dtype=r.dtype, device=r.device))
                sq += float(r.square().sum())
                sq_slack += float((e * (2 * r.abs() + e)).sum())
                w = self.weights(flat.numel())[:r.numel()].to(torch.float64)
                ws += float(torch.dot(r, w))
                a = r.abs()
                mag += float(a.sum())
                big = max(big, float(a.max()))
                del a
                if classes is None or classes.numel() < r.numel():
                    grown = torch.zeros(r.numel(), dtype=torch.float64, device=r.device)
                    if classes is not None:
                        grown[:classes.numel()] += classes
                    classes = grown
                classes[:r.numel()] += e
        spread = float(classes.square().sum()) ** 0.5 if classes is not None else 0.0
        sq_slack += (GPU_ROUNDING if on_gpu else DOT_ROUNDING) * abs(sq) + 1e-12
        return {"finite": count == 0, "sum_of_squares": sq, "sum_of_squares_slack": sq_slack,
                "weighted_sum": ws, "weighted_sum_slack": Z * spread + WEIGHTED_ROUNDING * mag + 1e-12,
                "fingerprint": fp, "nonfinite": count, "largest": big}

    def mismatch(self, got: list, want: dict) -> str:
        """"" when the reported statistics ``got`` (:data:`WIDTH` numbers) fit ``want``
        (:meth:`expected`), else what differs."""
        if self.full and (got[3] != want["nonfinite"] or got[2] != want["fingerprint"]):
            return (f"its {got[3]:.0f} NaN/Inf elements are not where the reference's {want['nonfinite']:.0f} are "
                    f"(position fingerprint {got[2]:.0f}, the reference's {want['fingerprint']:.0f})")
        for name, label in (("sum_of_squares", "the sum of squares of its finite elements"),
                            ("weighted_sum", "the randomly weighted sum of its finite elements")):
            g, w, s = got[0 if name == "sum_of_squares" else 1], want[name], want[name + "_slack"]
            if not math.isfinite(g) or abs(g - w) > s:
                return f"{label} is {g:.6g}, the reference's is {w:.6g} (at most {s:.3g} apart within atol/rtol)"
        return ""


def _norm_dtype(flat: Any) -> Any:
    """The dtype of a chunk's norm: float64 for a float64 ``flat`` (torch refuses a narrowing
    norm), float32 otherwise."""
    import torch

    return torch.float64 if flat.dtype == torch.float64 else torch.float32


def _sum_of_squares_into(flat: Any, slot: Any, wide: bool = False) -> None:
    """Add the sum of squares of ``flat`` to the 0-d float64 ``slot``; ``wide``: each chunk
    reduced in float64 (elements whose float32 squares would overflow)."""
    import torch

    if wide:
        for start in range(0, flat.numel(), CHUNK):
            c = flat[start:start + CHUNK].to(torch.float64)
            slot.add_(torch.dot(c, c))
        return
    if flat.is_cuda:  # one read of the output: a float32 norm (no float64 copy), squared in float64
        norm_dtype = _norm_dtype(flat)
        for start in range(0, flat.numel(), CHUNK):
            norm = torch.linalg.vector_norm(flat[start:start + CHUNK], dtype=norm_dtype)
            slot.add_(norm.to(torch.float64).square())
        return
    if flat.dtype not in (torch.float32, torch.float64):
        flat = flat.to(torch.float32)
    for start in range(0, flat.numel(), DOT_CHUNK):
        c = flat[start:start + DOT_CHUNK]
        slot.add_(torch.dot(c, c))


def largest_finite(obj: Any) -> float:
    """The largest magnitude of a finite element of ``obj``'s tensors (0.0 when none)."""
    import torch

    most = 0.0
    for t in _tensors(obj):
        flat = _flat(t)
        if flat.numel() == 0:
            continue
        low, high = (float(v) for v in torch.aminmax(flat))  # no temporary of the output's size
        if not (math.isfinite(low) and math.isfinite(high)):  # NaN/Inf present: the finite ones only
            low, high = (float(v) for v in torch.aminmax(torch.nan_to_num(flat, nan=0.0, posinf=0.0, neginf=0.0)))
        most = max(most, abs(low), abs(high))
    return most


def checksum_into(obj: Any, slot: Any) -> None:
    """Add the sum of squares of every tensor of ``obj`` to the 0-d float64 ``slot`` (queued
    on the device; nothing waits for it)."""
    for t in _tensors(obj):
        _sum_of_squares_into(_flat(t), slot)


def checksum(obj: Any) -> float:
    import torch

    tensors = _tensors(obj)
    if not tensors:
        return 0.0
    slot = torch.zeros((), dtype=torch.float64, device=tensors[0].device)
    checksum_into(obj, slot)
    return float(slot)


def checksum_bounds(ref: Any, atol: float, rtol: float, cpu_rounding: bool | None = None) -> tuple[float, float]:
    """(the reference's sum of squares, the largest difference an output within the
    tolerance can make to it): every element may move by ``e = atol + rtol |r|``, which moves
    its square by at most ``e (2 |r| + e)``; on the CPU the float32 rounding of the candidate
    side's dot products is allowed for too (``cpu_rounding``: whether it applies; by ``ref``'s
    device)."""
    import torch

    total, slack = 0.0, 0.0
    tensors = _tensors(ref)
    if cpu_rounding is None:
        cpu_rounding = not (tensors and tensors[0].is_cuda)
    for t in tensors:
        flat = _flat(t)
        for start in range(0, flat.numel(), 1 << 24):
            r = flat[start:start + (1 << 24)].to(torch.float64)
            e = atol + rtol * r.abs()
            total += float(r.square().sum())
            slack += float((e * (2 * r.abs() + e)).sum())
    return total, slack + (DOT_ROUNDING if cpu_rounding else GPU_ROUNDING) * abs(total) + 1e-12
