"""A transformer block's arithmetic time from measured primitives (the CPU side of the profile).

On a GPU the planner times a block with a roofline (`compute.py`).  On a CPU core the rate of a
GEMM depends strongly on its shape and every operator carries a fixed cost (dispatch, autograd),
so `par3d calibrate` measures the primitives a block is made of — as functions of their sizes, on
shapes chosen to span the range, never on a model it will be scored on — and this module composes
a block from them.  Each primitive is a least-squares fit linear in its parameters:

- linear layer, forward and backward (X: M×K, W: N×K):  t = t0 + F·(a + b/M + c/N + d/K), F = 2MNK.
  `a` is the inverse asymptotic rate; b, c, d are the micro-kernel's edge losses along each dimension
  (a thin matrix fills fewer of the register tiles; Goto & van de Geijn 2008, §6);
- scaled-dot-product attention (causal), forward and backward, on B·H heads of s×d:
  t = t0 + a·BH·s²·d + b·BH·s² + c·BH·s·d  (the two GEMMs, the softmax, reading Q, K, V);
- layer norm, GeLU, the residual add, the embedding lookup and the vocabulary cross entropy,
  forward and backward: t = t0 + a·elements (+ b·rows for the row-wise ones) — memory bound.

The block composition follows `model.py` (pre-LN attention and GeLU MLP, Megatron's column/row
split under TP, sequence parallelism shards the layer norms and residuals).  Fixed costs of the
Python around the primitives are the profile's `overheads` (measured apart, see calibrate).
Importing this module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# primitive name -> feature names, in the order of a fit's coefficients
FEATURES: dict[str, tuple[str, ...]] = {
    "linear": ("1", "F", "F/M", "F/N", "F/K"),
    "attention": ("1", "BH*s*s*d", "BH*s*s", "BH*s*d"),
    "layer_norm": ("1", "elements", "rows"),
    "gelu": ("1", "elements"),
    "add": ("1", "elements"),
    "embedding": ("1", "elements"),
    "cross_entropy": ("1", "elements", "rows"),
    # ring attention's pieces (context_parallel.py): one block of r query rows against c key rows,
    # forward (scores, log-sum-exp, P·V) and its exact backward; the log-sum-exp merge of a block
    # into the running output (memory traffic over the block's r·d outputs and r rows)
    "ring_block": ("1", "BH*r*c*d", "BH*r*c", "BH*r*d"),
    "merge": ("1", "elements", "rows"),
}


def features(kind: str, **size: float) -> tuple[float, ...]:
    """The regressors of one primitive call: linear(m, n, k), attention(bh, s, d), ring_block(bh, r,
    c, d), the others (elements, rows)."""
    if kind == "linear":
        m, n, k = size["m"], size["n"], size["k"]
        f = 2.0 * m * n * k
        return (1.0, f, f / m, f / n, f / k)
    if kind == "attention":
        bh, s, d = size["bh"], size["s"], size["d"]
        return (1.0, bh * s * s * d, bh * s * s, bh * s * d)
    if kind == "ring_block":
        bh, r, c, d = size["bh"], size["r"], size["c"], size["d"]
        return (1.0, bh * r * c * d, bh * r * c, bh * r * d)
    if kind in ("layer_norm", "cross_entropy", "merge"):
        return (1.0, size["elements"], size["rows"])
    return (1.0, size["elements"])


@dataclass(frozen=True)
class Fit:
    """Coefficients of one primitive's forward or backward time (seconds) on its `FEATURES`."""

    coef: tuple[float, ...]

    def __call__(self, x: tuple[float, ...]) -> float:
        return max(0.0, sum(c * v for c, v in zip(self.coef, x, strict=True)))


@dataclass(frozen=True)
class KernelModel:
    """Per primitive, the forward and backward fits (`Fit`), for one dtype (the run's)."""

    dtype: str
    fits: tuple[tuple[str, Fit, Fit], ...]  # (primitive, forward, backward)

    def fit(self, kind: str) -> tuple[Fit, Fit]:
        for k, f, b in self.fits:
            if k == kind:
                return f, b
        raise KeyError(kind)

    def time(self, kind: str, **size: float) -> tuple[float, float]:
        f, b = self.fit(kind)
        x = features(kind, **size)
        return f(x), b(x)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> KernelModel:
        fits = tuple((k, Fit(tuple(float(c) for c in v["forward"])), Fit(tuple(float(c) for c in v["backward"])))
                     for k, v in sorted(d["primitives"].items()))
        return KernelModel(str(d.get("dtype", "fp32")), fits)

    # ---- a block, the embedding and the head, on one rank ------------------------------------

    def has(self, kind: str) -> bool:
        return any(k == kind for k, _, _ in self.fits)

    def ring_attention(self, bh: int, seq: int, d: int, cp: int) -> tuple[float, float]:
        """Ring attention on one CP rank (context_parallel.py), arithmetic only (the K/V exchanges
        are the cost model's): `seq` local tokens = two chunks of c = seq/2.  Forward: the own block
        (2c × 2c, causal mask), cp − 1 remote blocks of 2c² scores (2c rows × c keys or c rows × 2c
        keys: half the ranks each, so the mean) each merged into the output; the K/V stack.
        Backward: the same cp blocks' backward, D = rowsum(dO ∘ O), the dQ / dK / dV accumulations.
        A file calibrated before these primitives were probed prices each block as cp causal
        attentions of the local tokens (a coarser stand-in)."""
        c = seq // 2
        if not self.has("ring_block"):
            f, b = self.time("attention", bh=bh, s=seq, d=d)
            return cp * f, cp * b
        own = self.time("ring_block", bh=bh, r=2 * c, c=2 * c, d=d)
        mask = self.time("add", elements=bh * 4 * c * c)  # the causal mask of the own block
        wide = self.time("ring_block", bh=bh, r=2 * c, c=c, d=d)
        tall = self.time("ring_block", bh=bh, r=c, c=2 * c, d=d)
        rem = ((wide[0] + tall[0]) / 2, (wide[1] + tall[1]) / 2)
        mrg = [self.time("merge", elements=bh * r * d, rows=bh * r)[0] for r in (2 * c, c)]
        kv = self.time("add", elements=2 * bh * seq * d)[0]  # stacking K and V for the ring
        acc = [self.time("add", elements=bh * r * d)[0] for r in (2 * c, c)]  # one += of r rows × d
        fwd = own[0] + mask[0] + (cp - 1) * (rem[0] + sum(mrg) / 2) + kv
        # backward: D, the K/V stack, the own block (mask included) and cp − 1 remote ones, each
        # adding its dQ rows and its dK, dV rows into the accumulators
        bwd = (self.time("add", elements=bh * seq * d)[0] + kv + own[1] + mask[0] + acc[0] + 2 * acc[0]
               + (cp - 1) * (rem[1] + (acc[0] + acc[1]) / 2 + 2 * (acc[0] + acc[1]) / 2))
        return fwd, bwd

    def block(self, h: int, ffn: int, heads: int, seq: int, b: int, tp: int, sp: bool, cp: int = 1) -> BlockTimes:
        """One transformer block, one micro-batch of b sequences of `seq` tokens on this rank (s/cp
        under context parallelism, whose attention is the ring: `ring_attention`), model.py's Block."""
        tok = b * seq
        tok_ln = tok // tp if sp and tp > 1 else tok  # SP: norms and residuals on s/tp tokens
        lin = [self.time("linear", m=tok, n=3 * h // tp, k=h), self.time("linear", m=tok, n=h, k=h // tp),
               self.time("linear", m=tok, n=ffn // tp, k=h), self.time("linear", m=tok, n=h, k=ffn // tp)]
        att = (self.time("attention", bh=b * heads // tp, s=seq, d=h // heads) if cp == 1
               else self.ring_attention(b * heads // tp, seq, h // heads, cp))
        ln = self.time("layer_norm", elements=tok_ln * h, rows=tok_ln)
        ge = self.time("gelu", elements=tok * ffn // tp)
        res = self.time("add", elements=tok_ln * h)  # a residual add
        cp = self.time("add", elements=tok * h // tp)  # heads merged back: one copy of T×h/tp
        fwd = sum(f for f, _ in lin) + att[0] + 2 * ln[0] + ge[0] + 2 * res[0] + cp[0]
        bwd = sum(g for _, g in lin) + att[1] + 2 * ln[1] + ge[1] + 2 * res[1] + cp[1]
        return BlockTimes(fwd, bwd, att[0], att[1])

    def embedding(self, h: int, seq: int, b: int, tp: int, sp: bool) -> tuple[float, float]:
        tok = b * seq
        e = self.time("embedding", elements=tok * h)
        pos = self.time("add", elements=(tok // tp if sp and tp > 1 else tok) * h)
        return e[0] + pos[0], e[1] + pos[1]

    def head(self, h: int, vocab: int, seq: int, b: int, tp: int, sp: bool) -> tuple[float, float]:
        """Final layer norm, the vocabulary-parallel output GEMM and the loss (model.py's Head)."""
        tok = b * seq
        tok_ln = tok // tp if sp and tp > 1 else tok
        v = -(-vocab // tp)
        ln = self.time("layer_norm", elements=tok_ln * h, rows=tok_ln)
        lin = self.time("linear", m=tok, n=v, k=h)
        ce = self.time("cross_entropy", elements=tok * v, rows=tok)
        return ln[0] + lin[0] + ce[0], ln[1] + lin[1] + ce[1]


@dataclass(frozen=True)
class BlockTimes:
    fwd: float
    bwd: float
    core_fwd: float  # the attention core (what selective recomputation redoes)
    core_bwd: float


__all__ = ["BlockTimes", "FEATURES", "Fit", "KernelModel", "features"]
