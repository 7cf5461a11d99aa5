"""Composers: turn seed operators into candidate models.

:class:`RuleComposer` (the default) stacks 1 to 5 operators with shape inference,
drawing the op count from a configurable mix (the paper's by default). Candidate
``i`` depends only on (seed, i), so a resumed run regenerates the same candidates.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from cuda_agent.core.errors import ConfigError

from .ops import PRESETS, Builder, NotApplicable, OpDef

# share of tasks by op count in CUDA-Agent-Ops-6K
PAPER_MIX = {1: 0.034, 2: 0.838, 3: 0.076, 4: 0.028, 5: 0.012}
PAPER_TRANSFORMERS_SHARE = 0.012
START_RANKS = {2: 0.25, 3: 0.17, 4: 0.43, 5: 0.15}
HEAVY = {"conv", "matmul", "norm", "pool"}


@dataclass
class Candidate:
    index: int
    code: str
    ops: list[str]
    source: str = "torch"  # "torch" or "transformers"
    composer: str = "rule"
    meta: dict = field(default_factory=dict)

    @property
    def n_ops(self) -> int:
        return len(self.ops)


def normalise_mix(mix: dict) -> dict[int, float]:
    out = {}
    for k, v in (mix or {}).items():
        try:
            n = int(k)
            w = float(v)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"bad op_mix entry {k!r}: {v!r}") from exc
        if not 1 <= n <= 5:
            raise ConfigError(f"op_mix counts must be 1..5, got {n}")
        if w < 0:
            raise ConfigError(f"op_mix weight for {n} must be >= 0")
        if w > 0:
            out[n] = w
    if not out:
        raise ConfigError("op_mix has no positive weight")
    total = sum(out.values())
    return {k: v / total for k, v in sorted(out.items())}


def _weighted(rng: random.Random, items: list, weights: list[float]):
    return rng.choices(items, weights=weights, k=1)[0]


class RuleComposer:
    name = "rule"

    def __init__(
        self,
        seeds: dict[str, OpDef],
        shapes: str = "small",
        op_mix: dict | None = None,
        transformers_share: float = PAPER_TRANSFORMERS_SHARE,
        seed: int = 0,
        attempts: int = 40,
    ):
        if shapes not in PRESETS:
            raise ConfigError(f"unknown shape preset {shapes!r}; choose from {', '.join(PRESETS)}")
        if not seeds:
            raise ConfigError("no seed operators available")
        self.seeds = seeds
        self.preset = PRESETS[shapes]
        self.mix = normalise_mix(op_mix or PAPER_MIX)
        self.hf_ops = [o for o in seeds.values() if o.source == "transformers"]
        self.torch_ops = [o for o in seeds.values() if o.source != "transformers"]
        self.transformers_share = transformers_share if self.hf_ops else 0.0
        self.seed = seed
        self.attempts = attempts

    def op_count(self, rng: random.Random) -> int:
        ks = list(self.mix)
        return _weighted(rng, ks, [self.mix[k] for k in ks])

    def compose(self, index: int) -> Candidate | None:
        rng = random.Random(f"{self.seed}:{index}")
        k = self.op_count(rng)
        hf_pos = rng.randrange(k) if rng.random() < self.transformers_share else -1
        for _ in range(self.attempts):
            built = self._try(rng, k, hf_pos)
            if built is not None:
                b, chain = built
                names = [o.name for o in chain]
                doc = "Model that performs " + ", then ".join(_describe(n) for n in names) + "."
                code = b.render(doc)
                src = "transformers" if any(o.source == "transformers" for o in chain) else "torch"
                return Candidate(index, code, names, src, "rule", {"categories": [o.category for o in chain]})
        return None

    def _try(self, rng: random.Random, k: int, hf_pos: int):
        b = Builder(rng, self.preset)
        b.input_fn = "torch.rand" if rng.random() < 0.6 else "torch.randn"
        chain: list[OpDef] = []
        # first op decides the input rank
        first_pool = self.hf_ops if hf_pos == 0 else self.torch_ops
        first_pool = [o for o in first_pool if not (o.terminal and k > 1)]
        weights = [o.weight * (2.0 if o.category in HEAVY else 1.0) for o in first_pool]
        first = _weighted(rng, first_pool, weights)
        ranks = [r for r in START_RANKS if first.accepts(r)]
        if not ranks:
            return None
        b.start(_weighted(rng, ranks, [START_RANKS[r] for r in ranks]))
        if not self._apply(b, first):
            return None
        chain.append(first)
        for pos in range(1, k):
            pool = self.hf_ops if pos == hf_pos else self.torch_ops
            pool = [
                o
                for o in pool
                if o.accepts(b.rank) and (not o.terminal or pos == k - 1) and o.name != chain[-1].name
            ]
            placed = False
            for _ in range(8):
                if not pool:
                    break
                op = _weighted(rng, pool, [o.weight for o in pool])
                if self._apply(b, op):
                    chain.append(op)
                    placed = True
                    break
                pool = [o for o in pool if o is not op]
            if not placed:
                return None
        return b, chain

    @staticmethod
    def _apply(b: Builder, op: OpDef) -> bool:
        saved = (
            list(b.shape), dict(b.consts), list(b.init_params), list(b.init_lines), list(b.forward_lines),
            list(b.inputs), set(b.imports), set(b.attrs),
        )
        try:
            op.apply(b)
        except NotApplicable:
            (b.shape, b.consts, b.init_params, b.init_lines, b.forward_lines, b.inputs, b.imports, b.attrs) = saved
            return False
        b.ops.append(op.name)
        return True


def _describe(name: str) -> str:
    short = name.split(".", 1)[-1]
    if "[" in short:
        short = short.replace("[input]", " with a second input").replace("[gram]", " (Gram matrix)")
    return short
