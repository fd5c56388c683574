"""Every collective and point-to-point call of par3d, counted; and the f / g operators.

Counting is the point: the seed (section 2.3) accounts the communication of each parallel form
exactly — TP moves activations (b·s·h per all-reduce, 2 forward + 2 backward per transformer
layer), DP moves parameters (once per step).  `COUNTER` records calls and bytes per
(group, kind) so a test can assert those numbers and `--comm-report` can print them.

Groups of size one never communicate and are never counted: that is what makes the model code
its own single-device reference.

The autograd operators (Megatron-LM's names in brackets):

  copy_to_tp        f: identity forward, all-reduce backward      (enter a column-parallel region)
  reduce_from_tp    g: all-reduce forward, identity backward      (leave a row-parallel region)
  gather_from_seq   SP: all-gather along the sequence forward, reduce-scatter backward
  reduce_scatter_to_seq  SP: reduce-scatter along the sequence forward, all-gather backward
  split_seq         take this rank's sequence shard (backward all-gathers)
  gather_last / split_last  the same along the last (hidden or vocabulary) dimension
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from par3d import timing
from par3d.mesh import Group

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv")


@dataclass
class CommCounter:
    """calls / bytes per (group name, kind).  Bytes are the payload of the logical operation:
    the tensor all-reduced, the full gathered output of an all-gather, the full input of a
    reduce-scatter, the tensor sent.  (What travels on the wire per rank is the ring formula
    2(E-1)/E·n of that payload; the planner applies it, the counter keeps the seed's units.)"""

    calls: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    bytes: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    elements: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(list))
    seconds: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    enabled: bool = True
    keep_sizes: bool = False
    pending: list[tuple[tuple[str, str], Any, Any]] = field(default_factory=list)  # CUDA event pairs

    def add(self, group: str, kind: str, t: torch.Tensor, dt: float = 0.0) -> None:
        self.add_sized(group, kind, t.numel(), t.element_size(), dt)

    def add_sized(self, group: str, kind: str, numel: int, element_size: int, dt: float = 0.0,
                  calls: int = 1) -> None:
        """`add` for a caller that knows the size already: `calls` messages of `numel` elements
        each, `dt` seconds in all (the pipeline's shared-memory transport counts a step at once)."""
        if not self.enabled:
            return
        key = (group, kind)
        self.calls[key] += calls
        self.bytes[key] += calls * numel * element_size
        self.seconds[key] += dt
        if self.keep_sizes:
            self.elements[key].extend([numel] * calls)

    def add_timed(self, group: str, kind: str, t: torch.Tensor, t0: Any, t1: Any) -> None:
        """`add` with the time between two timing.stamp()s: host seconds now, CUDA events once
        the counts are read (snapshot)."""
        if isinstance(t0, float):
            self.add(group, kind, t, t1 - t0)
            return
        self.add(group, kind, t, 0.0)
        if self.enabled:
            self.pending.append(((group, kind), t0, t1))

    def _resolve(self) -> None:
        for key, t0, t1 in self.pending:
            self.seconds[key] += timing.seconds(t0, t1)
        self.pending.clear()

    def reset(self) -> None:
        self.pending.clear()
        self.calls.clear()
        self.bytes.clear()
        self.elements.clear()
        self.seconds.clear()

    def snapshot(self) -> dict[str, dict[str, dict[str, float]]]:
        """{group: {kind: {"calls", "bytes", "seconds"}}} — JSON-ready."""
        self._resolve()
        out: dict[str, dict[str, dict[str, float]]] = {}
        for (g, k), c in sorted(self.calls.items()):
            out.setdefault(g, {})[k] = {"calls": c, "bytes": self.bytes[(g, k)],
                                        "seconds": round(self.seconds[(g, k)], 6)}
        return out


COUNTER = CommCounter()


def _timed(group: Group, kind: str, t: torch.Tensor, work_fn: Any, blocking: bool = True) -> Any:
    """Run the collective and count it.  Seconds: a blocking call's duration — on a GPU between
    CUDA events around it in the stream (timing.stamp; resolved when the step's counts are read,
    so nothing waits here) — or, for an asynchronous one, the time to post it (its cost shows
    where it is waited on)."""
    device = t.device if blocking else None
    t0 = timing.stamp(device)
    res = work_fn()
    COUNTER.add_timed(group.name, kind, t, t0, timing.stamp(device))
    return res


# ---- plain collectives ------------------------------------------------------------------------

def all_reduce(t: torch.Tensor, group: Group, op: Any = None, async_op: bool = False) -> Any:
    """In place.  Returns a work handle when async_op (None when nothing to do)."""
    if group.size == 1:
        return None
    op = dist.ReduceOp.SUM if op is None else op
    return _timed(group, "all_reduce", t,
                  lambda: dist.all_reduce(t, op=op, group=group.pg, async_op=async_op), blocking=not async_op)


def all_gather(t: torch.Tensor, group: Group, dim: int = 0) -> torch.Tensor:
    """Concatenate every rank's `t` along `dim` (in group-rank order)."""
    if group.size == 1:
        return t
    # the collective concatenates along dim 0: bring `dim` there and back
    moved = t.movedim(dim, 0).contiguous() if dim != 0 else t.contiguous()
    out = torch.empty((group.size * moved.shape[0],) + tuple(moved.shape[1:]), dtype=t.dtype, device=t.device)
    _timed(group, "all_gather", out, lambda: dist.all_gather_single(out, moved, group=group.pg))
    return out.movedim(0, dim).contiguous() if dim != 0 else out


def all_gather_into(out: torch.Tensor, t: torch.Tensor, group: Group, async_op: bool = False) -> Any:
    """Every rank's 1-D `t` concatenated (group-rank order) into the 1-D `out`, in place; with
    async_op the work handle to wait on (None when nothing to do)."""
    if group.size == 1:
        out.copy_(t)
        return None
    return _timed(group, "all_gather", out,
                  lambda: dist.all_gather_single(out, t.contiguous(), group=group.pg, async_op=async_op))


def reduce_scatter(t: torch.Tensor, group: Group, dim: int = 0, async_op: bool = False,
                   out: torch.Tensor | None = None) -> Any:
    """Sum over ranks, keep this rank's 1/E slice along `dim`.  With async_op returns (out, work)."""
    if group.size == 1:
        return (t, None) if async_op else t
    moved = t.movedim(dim, 0).contiguous() if dim != 0 else t.contiguous()
    if moved.shape[0] % group.size:
        raise ValueError(f"reduce_scatter: dim {dim} of size {moved.shape[0]} not divisible by {group.size}")
    if out is None:
        out = torch.empty((moved.shape[0] // group.size,) + tuple(moved.shape[1:]),
                          dtype=t.dtype, device=t.device)
    work = _timed(group, "reduce_scatter", moved,
                  lambda: dist.reduce_scatter_single(out, moved, group=group.pg, async_op=async_op),
                  blocking=not async_op)
    res = out.movedim(0, dim).contiguous() if dim != 0 else out
    return (res, work) if async_op else res


def broadcast(t: torch.Tensor, group: Group, src_index: int = 0) -> None:
    if group.size == 1:
        return
    _timed(group, "broadcast", t, lambda: dist.broadcast(t, src=group.ranks[src_index], group=group.pg))


def isend(t: torch.Tensor, dst: int, group: Group, tag: int = 0) -> Any:
    """Non-blocking send to global rank `dst`; the caller waits on the returned work."""
    return _timed(group, "send", t, lambda: dist.isend(t, dst=dst, group=group.pg, tag=tag), blocking=False)


def irecv(t: torch.Tensor, src: int, group: Group, tag: int = 0) -> Any:
    """Non-blocking receive from global rank `src` into `t`."""
    return _timed(group, "recv", t, lambda: dist.irecv(t, src=src, group=group.pg, tag=tag), blocking=False)


def exchange(send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, group: Group, tag: int = 0) -> list[Any]:
    """Send `send` to global rank `dst` and receive into `recv` from `src`, posted together (one
    batched call: a ring's send and receive must not wait for each other under NCCL).  Returns
    the work handles to wait on; nothing to do on a group of one."""
    if group.size == 1:
        return []
    t0 = time.perf_counter()
    ops = [dist.P2POp(dist.isend, send, dst, group.pg, tag), dist.P2POp(dist.irecv, recv, src, group.pg, tag)]
    works = dist.batch_isend_irecv(ops)
    dt = time.perf_counter() - t0
    COUNTER.add(group.name, "send", send, dt)
    COUNTER.add(group.name, "recv", recv, 0.0)
    return list(works)


# ---- the f and g operators ---------------------------------------------------------------------

class _CopyToTP(torch.autograd.Function):
    """f: identity forward, all-reduce of the input gradient backward (seed 2.3)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        g = g.contiguous().clone()
        all_reduce(g, ctx.group)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward (sum the partial products), identity backward (seed 2.3)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        x = x.contiguous().clone()
        all_reduce(x, group)
        return x

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return g, None


class _GatherFromSeq(torch.autograd.Function):
    """SP entry: all-gather along the sequence (dim 1) forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return all_gather(x, group, dim=1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return reduce_scatter(g, ctx.group, dim=1), None


class _ReduceScatterToSeq(torch.autograd.Function):
    """SP exit: reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return reduce_scatter(x, group, dim=1)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return all_gather(g, ctx.group, dim=1), None


class _SplitDim(torch.autograd.Function):
    """Keep this rank's slice along `dim`; backward all-gathers the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        n = x.shape[dim] // group.size
        return x.narrow(dim, group.rank * n, n).contiguous()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        return all_gather(g, ctx.group, dim=ctx.dim), None, None


class _GatherDim(torch.autograd.Function):
    """All-gather along `dim`; backward keeps this rank's slice of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return all_gather(x, group, dim=dim)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        n = g.shape[ctx.dim] // ctx.group.size
        return g.narrow(ctx.dim, ctx.group.rank * n, n).contiguous(), None, None


def copy_to_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _ReduceFromTP.apply(x, group)


def gather_from_seq(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _GatherFromSeq.apply(x, group)


def reduce_scatter_to_seq(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _ReduceScatterToSeq.apply(x, group)


def split_seq(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _SplitDim.apply(x, group, 1)


def split_last(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _SplitDim.apply(x, group, x.dim() - 1)


def gather_last(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _GatherDim.apply(x, group, x.dim() - 1)
