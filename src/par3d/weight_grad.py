"""Deferred weight gradients: the split backward of the zero-bubble schedules.

A linear layer's backward is two GEMMs that need different things: the input gradient
dx = dy·W (the previous pipeline stage waits for it) and the weight gradient dW = dyᵀ·x
(nothing waits for it until the optimizer step).  Zero-bubble schedules (Qi et al. 2023) run
them as two actions, BI and BW.  Eager autograd computes both in one walk of the graph, and
restricting a walk to the input (``inputs=[x]``) and walking again for the weights repeats
everything between them.  Instead, every linear layer of the model goes through `linear`:

* under `deferring(store)` (the runtime's BI) its backward computes dx and the bias gradient
  (a sum: nothing to defer) and appends (W, x, dy) to ``store`` instead of computing dW — the
  layer's input and the gradient at its output, what torch.distributed.pipelining's
  ``stage_backward_weight`` keeps too; every other parameter (norms, embeddings) gets its
  gradient as usual, and the graph is freed at the end of BI;
* `apply(store)` (the runtime's BW) computes only the dW GEMMs, each as the backward of a one-
  node graph on its weight, so autograd's own accumulation takes the result (no copy) and
  gradient hooks — the data-parallel buckets — fire exactly as after a full backward.

Outside `deferring` the same function computes dW at once, so a full B costs what it costs with
``F.linear``.  `linear` is plain ``F.linear`` unless `splittable()` is on (the runtime turns it on
for ranks whose schedule holds BI/BW), so other schedules run the built-in op unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

# One walker per process (a rank runs its schedule in one thread), so module state is enough.
_SPLITTABLE = False
_STORE: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x)
        # the parameter itself, not a saved copy: BW accumulates into *this* leaf (a saved tensor
        # comes back through the saved-tensor hooks as another object)
        ctx.weight = weight
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (x,) = ctx.saved_tensors
        weight = ctx.weight
        need_x, need_w, need_b = ctx.needs_input_grad
        dx = dy.matmul(weight) if need_x else None
        db = dy.sum(dim=tuple(range(dy.dim() - 1))) if (ctx.has_bias and need_b) else None
        dw = None
        if need_w:
            if _STORE is not None:
                _STORE.append((weight, x, dy))
            else:
                dw = _weight_grad(x, dy)
        return dx, dw, db


def _weight_grad(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dW = dyᵀ·x over every leading (batch, sequence) position: one GEMM."""
    return dy.reshape(-1, dy.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1]))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x·Wᵀ + b, whose weight gradient can be deferred (see the module doc)."""
    if _SPLITTABLE and torch.is_grad_enabled():
        return _Linear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


@contextmanager
def splittable(on: bool = True) -> Iterator[None]:
    """Linear layers built inside go through the deferrable op (forward, recomputation, backward
    must agree: a recomputed checkpoint has to save what the first forward saved)."""
    global _SPLITTABLE
    before, _SPLITTABLE = _SPLITTABLE, on
    try:
        yield
    finally:
        _SPLITTABLE = before


@contextmanager
def deferring(store: list) -> Iterator[list]:
    """Backward passes inside append (W, x, dy) to `store` instead of computing dW."""
    global _STORE
    before, _STORE = _STORE, store
    try:
        yield store
    finally:
        _STORE = before


class _WeightGEMM(torch.autograd.Function):
    """A one-node graph whose backward is one deferred weight GEMM.  BW walks these nodes instead
    of handing finished gradients to ``torch.autograd.backward``: the GEMM's result is then held by
    the engine alone, so AccumulateGrad takes it as the weight's gradient (or adds it in place into
    an existing one, e.g. the data-parallel flat buffer) instead of copying it, and each (x, dy)
    pair is freed as soon as its GEMM is done, so the next GEMM's output reuses that memory.  A
    weight used twice (a tied head) gets both GEMMs summed into one accumulation, as autograd does.
    Measured (`par3d bench split`'s chunk): BW 13.6 -> 10.4 ms against a 21.6 ms B."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        # (x, dy) come in a tuple, not as tensor arguments: autograd must not link this node to
        # the (already freed) graph that produced them
        ctx.pair = pair
        ctx.dtype = weight.dtype
        return weight.new_empty(())  # never read, and the weight's values are not (ZeRO-3 may have freed them)

    @staticmethod
    def backward(ctx: Any, _: torch.Tensor) -> tuple[torch.Tensor, None]:
        x, dy = ctx.pair
        ctx.pair = None
        dw = _weight_grad(x, dy)
        return (dw if dw.dtype == ctx.dtype else dw.to(ctx.dtype)), None


def apply(store: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
    """The deferred weight GEMMs, accumulated into the weights' gradients (their hooks fire)."""
    if not store:
        return
    with torch.enable_grad():
        roots = [_WeightGEMM.apply(weight, (x, dy)) for weight, x, dy in store]
    store.clear()
    torch.autograd.backward(roots)  # scalar roots: each seeded with 1, never used
