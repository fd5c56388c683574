"""Megatron-style tensor-parallel layers (seed section 2.3; Shoeybi et al. 2019).

  ColumnParallelLinear   "partition output": W split by output rows; enters the TP region with f
  RowParallelLinear      "reduce output":    W split by input columns; leaves it with g
  VocabParallelEmbedding the table split by vocabulary rows; partial lookups summed with g
  vocab_parallel_cross_entropy  the loss over vocabulary-sharded logits, never gathering them
                                (one rank: torch's fused cross-entropy, the same loss)

With a TP group of size one every layer is the plain layer (f and g are identities), so the
same code on one process is the reference every parallel run is compared with.

Initialisation: every weight is drawn *whole* from a generator keyed by (seed, name) and then
sliced, so the TP=4 shards are exactly slices of the TP=1 weight (the seed's MPI example draws
the full A and B on every rank and cuts them the same way).
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from par3d import comm
from par3d.mesh import Group
from par3d.weight_grad import linear  # F.linear whose weight GEMM a split backward can defer


def full_init(shape: tuple[int, ...], std: float, seed: int, name: str) -> torch.Tensor:
    """The full (unsharded) fp32 tensor for parameter `name`, independent of any layout."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.randn(shape, generator=g, dtype=torch.float32) * std


def shard_rows(full: torch.Tensor, group: Group, stride: int = 1) -> torch.Tensor:
    """This rank's rows.  With stride k the rows are k equal blocks (e.g. Q|K|V), each split
    across ranks, so a rank gets the matching rows of every block (its heads' Q, K and V)."""
    blocks = full.chunk(stride, dim=0)
    return torch.cat([b.chunk(group.size, dim=0)[group.rank] for b in blocks], dim=0).contiguous()


def shard_cols(full: torch.Tensor, group: Group) -> torch.Tensor:
    return full.chunk(group.size, dim=1)[group.rank].contiguous()


def mark_sequence_parallel(p: nn.Parameter) -> nn.Parameter:
    """A replicated parameter used on sequence-sharded activations: each TP rank sees a different
    part of the sequence, so its gradient is partial and must be summed over TP after backward."""
    p.sequence_parallel = True  # type: ignore[attr-defined]
    return p


def mark_tp_partial(p: nn.Parameter) -> nn.Parameter:
    """A parameter replicated on every TP rank whose use differs per rank (K/V heads replicated when
    tp > kv_heads: each rank uses the rows of its own group's head).  Like a sequence-parallel
    replica its gradient is partial and is summed over TP after backward (the same marker)."""
    return mark_sequence_parallel(p)


def mark_tp_sharded(p: nn.Parameter, dim: int = 0, stride: int = 1) -> nn.Parameter:
    """A parameter each TP rank holds a different slice of, along `dim` (in `stride` blocks).
    Sharded parameters count on every rank in the gradient norm, replicated ones on TP rank 0
    only; `unshard` uses (dim, stride) to rebuild the full tensor."""
    p.tp_sharded = True  # type: ignore[attr-defined]
    p.shard_dim, p.shard_stride = dim, stride  # type: ignore[attr-defined]
    return p


def unshard(local: torch.Tensor, p: nn.Parameter, group: Group) -> torch.Tensor:
    """The full tensor of parameter (or gradient of) `p` from every TP rank's slice."""
    if not getattr(p, "tp_sharded", False) or group.size == 1:
        return local
    dim, stride = p.shard_dim, p.shard_stride  # type: ignore[attr-defined]
    pieces = comm.all_gather(local.contiguous(), group, dim=dim).chunk(group.size, dim=dim)
    if stride == 1:
        return torch.cat(pieces, dim=dim)
    # each rank's slice is [block0 part | block1 part | ...]; regroup block by block
    parts = [pc.chunk(stride, dim=dim) for pc in pieces]
    return torch.cat([parts[r][b] for b in range(stride) for r in range(group.size)], dim=dim)


class ColumnParallelLinear(nn.Module):
    """y = x Wᵀ + b with W [out, in] split by rows: each rank computes out/E output features.

    Forward enters the TP region: f (identity; all-reduce of dx in backward), or with sequence
    parallelism an all-gather of the sequence-sharded input (reduce-scatter in backward).
    `enter=False` when the caller already entered (one f for Q, K and V together).
    """

    def __init__(self, in_f: int, out_f: int, group: Group, *, seed: int, name: str, std: float = 0.02,
                 bias: bool = True, stride: int = 1, gather_output: bool = False, enter: bool = True,
                 sequence_parallel: bool = False, dtype: torch.dtype = torch.float32):
        super().__init__()
        if out_f % (group.size * stride):
            raise ValueError(f"{name}: out_features={out_f} not divisible by tp={group.size} x stride={stride}")
        self.group, self.gather_output, self.enter, self.sp = group, gather_output, enter, sequence_parallel
        w = shard_rows(full_init((out_f, in_f), std, seed, name + ".weight"), group, stride)
        self.weight = mark_tp_sharded(nn.Parameter(w.to(dtype)), 0, stride)
        self.bias = (mark_tp_sharded(nn.Parameter(torch.zeros(out_f // group.size, dtype=dtype)), 0, stride)
                     if bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.enter:
            x = comm.gather_from_seq(x, self.group) if self.sp else comm.copy_to_tp(x, self.group)
        y = linear(x, self.weight, self.bias)
        return comm.gather_last(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """y = x Wᵀ + b with W [out, in] split by columns: the input arrives split (the output of a
    column-parallel layer), each rank computes a partial sum, and g sums them (seed 2.3:
    "reduce output").  With sequence parallelism the sum is a reduce-scatter along the sequence.
    The bias is added once, after the reduction."""

    def __init__(self, in_f: int, out_f: int, group: Group, *, seed: int, name: str, std: float = 0.02,
                 bias: bool = True, sequence_parallel: bool = False, dtype: torch.dtype = torch.float32):
        super().__init__()
        if in_f % group.size:
            raise ValueError(f"{name}: in_features={in_f} not divisible by tp={group.size}")
        self.group, self.sp = group, sequence_parallel
        w = shard_cols(full_init((out_f, in_f), std, seed, name + ".weight"), group)
        self.weight = mark_tp_sharded(nn.Parameter(w.to(dtype)), 1)
        self.bias = nn.Parameter(torch.zeros(out_f, dtype=dtype)) if bias else None
        if self.bias is not None and sequence_parallel:
            mark_sequence_parallel(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight)
        y = comm.reduce_scatter_to_seq(y, self.group) if self.sp else comm.reduce_from_tp(y, self.group)
        return y + self.bias if self.bias is not None else y


def padded_vocab(vocab: int, tp: int) -> int:
    """Vocabulary rounded up to a multiple of tp; the extra rows never win the softmax."""
    return int(math.ceil(vocab / tp) * tp)


class VocabParallelEmbedding(nn.Module):
    """Token embedding with the table split by vocabulary rows.  A rank looks up the tokens it
    owns, writes zeros for the others, and g sums the partial lookups (one all-reduce of b·s·h,
    or a reduce-scatter along the sequence with sequence parallelism)."""

    def __init__(self, vocab: int, hidden: int, group: Group, *, seed: int, name: str, std: float = 0.02,
                 sequence_parallel: bool = False, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.group, self.sp, self.vocab = group, sequence_parallel, vocab
        self.vocab_padded = padded_vocab(vocab, group.size)
        per = self.vocab_padded // group.size
        self.start, self.end = group.rank * per, (group.rank + 1) * per
        full = torch.zeros(self.vocab_padded, hidden)
        full[:vocab] = full_init((vocab, hidden), std, seed, name + ".weight")
        self.weight = mark_tp_sharded(nn.Parameter(full[self.start:self.end].contiguous().to(dtype)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            out = F.embedding(tokens, self.weight)
        else:
            outside = (tokens < self.start) | (tokens >= self.end)
            local = (tokens - self.start).masked_fill(outside, 0)
            out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return comm.reduce_scatter_to_seq(out, self.group) if self.sp else comm.reduce_from_tp(out, self.group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy over logits split by vocabulary across the TP group.

    Three all-reduces of b·s elements (max, target logit, sum of exponentials) replace a gather
    of b·s·V logits (Megatron-LM's vocab-parallel loss)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, group: Group, start: int,
                vocab: int) -> torch.Tensor:
        logits = logits.float()
        n_local = logits.shape[-1]
        # columns past the real vocabulary are padding: they must not take probability mass
        n_real = max(0, min(n_local, vocab - start))
        if n_real < n_local:
            logits = logits.clone()
            logits[..., n_real:] = float("-inf")
        lmax = logits.max(dim=-1).values
        comm.all_reduce(lmax, group, op=torch.distributed.ReduceOp.MAX)
        shifted = logits - lmax.unsqueeze(-1)
        outside = (target < start) | (target >= start + n_local)
        local_t = (target - start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        comm.all_reduce(picked, group)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        comm.all_reduce(sum_exp, group)
        loss = sum_exp.log() - picked
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local_t, outside)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> Any:
        softmax, local_t, outside = ctx.saved_tensors
        grad = softmax.clone()
        onehot = torch.zeros_like(grad).scatter_(-1, local_t.unsqueeze(-1), 1.0)
        grad -= onehot * (~outside).unsqueeze(-1).to(grad.dtype)
        grad *= grad_loss.unsqueeze(-1)
        return grad, None, None, None, None


def vocab_parallel_cross_entropy(logits_local: torch.Tensor, target: torch.Tensor, group: Group,
                                 vocab_start: int, vocab: int) -> torch.Tensor:
    """Per-token loss [b, s] in fp32 from this rank's logits [b, s, V_pad/E].

    A TP group of one holds the whole vocabulary: then torch's fused log-softmax + NLL (two
    kernels forward and two backward) computes the same loss as the sharded version's ~15 small
    ops and their Python, which on the peers benchmark's last stage (b 2, s 64, V 256, one CPU
    thread) cost 0.3-0.5 ms more per micro-batch, forward and backward: 2-3 % of that stage's
    work (benchmarks/README.md, "Reading the rows").  TP > 1 keeps the sharded version, and the
    equivalence tests compare it with this one."""
    if group.size == 1:
        logits = logits_local.float()
        if logits.shape[-1] > vocab:  # padding columns (none at tp 1 today; kept out all the same)
            logits = logits[..., :vocab]
        return F.cross_entropy(logits.flatten(0, -2), target.flatten(), reduction="none").view(target.shape)
    return _VocabParallelCrossEntropy.apply(logits_local.float(), target, group, vocab_start, vocab)
