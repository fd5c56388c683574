"""Context parallelism: the sequence split over the CP group, attention as a ring of K/V blocks.

Layout (causal load balancing; Liu et al. 2023 "Ring Attention", with the zig-zag split that
Megatron-LM's context parallelism and Llama 3 use): the sequence of s tokens is cut into 2·cp
chunks of c = s/(2·cp); CP rank r holds chunks r and 2·cp-1-r, in that order.  Under a causal
mask chunk i attends to chunks <= i, so the early chunk (little work) and its mirror (much work)
give every rank the same amount of attention work.  `local_positions` says which positions a
rank holds: the data, the position embedding (and RoPE) follow it.

Everything but attention is token-wise, so it runs on the local 2c tokens unchanged.  Attention
(`ring_attention`): the ring passes each rank's K/V block to the next rank cp-1 times; a rank
merges the partial softmax of every block it sees into its output with the log-sum-exp rule

    lse = log(e^lse_a + e^lse_b),   out = out_a·e^(lse_a-lse) + out_b·e^(lse_b-lse)

(Milakov & Gimelshein 2018 "Online normalizer calculation for softmax"; the FlashAttention
recurrence).  Which blocks are needed follows from the chunk indices: with the block of rank j
at ring step t = (r - j) mod cp,
    t = 0   (own block)  causal mask on the rank's own two chunks;
    j < r                both local query chunks see the first chunk of j (its mirror is later);
    j > r                only the second local query chunk sees j's chunks, both of them.
So every step after the first costs c x 2c scores on every rank.  The block of the next step is
sent while this step computes.

Backward is exact and also a ring (the FlashAttention-2 backward, block by block): with the final
lse and D = rowsum(dO ∘ O), each block gives P = exp(S - lse), dV += Pᵀ dO, dS = P ∘ (dO Vᵀ - D),
dQ += dS K·scale, dK += dSᵀ Q·scale.  The K/V blocks travel the ring again, and their dK/dV
accumulators travel with them: after cp steps each accumulator is back on the rank that owns the
block.  Only the local Q, K, V, O and lse are saved for backward, so activation memory falls as
1/cp; the remote blocks are received again instead of being kept.

Transfers go through `comm.exchange` (one batched send to the next rank and receive from the
previous, as NCCL wants for a ring).  Attention dropout is not supported here (the config
refuses dropout with cp > 1).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from par3d import comm
from par3d.mesh import Group

_TAG_KV, _TAG_DKV = 7001, 7002


def local_positions(seq_len: int, cp: int, cp_rank: int) -> list[int]:
    """The global positions CP rank `cp_rank` holds, in local order: chunk r, then chunk 2cp-1-r."""
    if cp == 1:
        return list(range(seq_len))
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len={seq_len} is not divisible by 2 x cp = {2 * cp}")
    c = seq_len // (2 * cp)
    a, b = cp_rank, 2 * cp - 1 - cp_rank
    return list(range(a * c, (a + 1) * c)) + list(range(b * c, (b + 1) * c))


def split_sequence(t: torch.Tensor, group: Group, dim: int = 1) -> torch.Tensor:
    """This CP rank's tokens of a full-sequence tensor (tokens, targets): its two chunks."""
    if group.size == 1:
        return t
    idx = torch.tensor(local_positions(t.shape[dim], group.size, group.rank), device=t.device)
    return t.index_select(dim, idx).contiguous()


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, mask: torch.Tensor | None) -> torch.Tensor:
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


def _block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of one block: (normalised output, log-sum-exp per query row)."""
    s = _scores(q, k, scale, mask)
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v), lse


def _block_backward(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, dob: torch.Tensor, lse_b: torch.Tensor,
                    d_b: torch.Tensor, scale: float,
                    mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block's share of the exact backward (FlashAttention-2's recurrence): (dQ, dK, dV) of its
    query rows and key rows, from the final log-sum-exp and D = rowsum(dO ∘ O) of those rows."""
    p = torch.exp(_scores(qb, kb, scale, mask) - lse_b.unsqueeze(-1))
    dv_b = torch.matmul(p.transpose(-1, -2), dob)
    ds = p * (torch.matmul(dob, vb.transpose(-1, -2)) - d_b.unsqueeze(-1))
    return torch.matmul(ds, kb) * scale, torch.matmul(ds.transpose(-1, -2), qb) * scale, dv_b


def _merge(out: torch.Tensor, lse: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """In place: fold block (o_b, lse_b) into the running (out, lse) of the same query rows."""
    new = torch.logaddexp(lse, lse_b)
    out.mul_(torch.exp(lse - new).unsqueeze(-1)).add_(o_b * torch.exp(lse_b - new).unsqueeze(-1))
    lse.copy_(new)


def _plan(t: int, r: int, cp: int, c: int) -> tuple[slice, slice]:
    """(query rows, key rows) of the local layout that ring step t needs (t > 0)."""
    j = (r - t) % cp
    if j < r:
        return slice(0, 2 * c), slice(0, c)
    return slice(c, 2 * c), slice(0, 2 * c)


def _own_mask(cp: int, r: int, c: int, device: torch.device) -> torch.Tensor:
    """Causal mask of the rank's own block: key position <= query position, global positions."""
    pos = torch.tensor(local_positions(2 * c * cp, cp, r), device=device)
    return pos.unsqueeze(0) <= pos.unsqueeze(1)


def _ring_peers(group: Group) -> tuple[int, int]:
    n, r = group.size, group.rank
    return group.ranks[(r + 1) % n], group.ranks[(r - 1) % n]


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Group) -> torch.Tensor:
        cp, r = group.size, group.rank
        dtype = q.dtype
        qf, kf, vf = q.float(), k.float(), v.float()
        c = q.shape[-2] // 2
        scale = 1.0 / math.sqrt(q.shape[-1])
        nxt, prv = _ring_peers(group)
        kv = torch.stack([kf, vf]).contiguous()
        out, lse = _block_forward(qf, kf, vf, scale, _own_mask(cp, r, c, q.device))
        for t in range(1, cp):
            incoming = torch.empty_like(kv)
            works = comm.exchange(kv, nxt, incoming, prv, group, _TAG_KV)
            for w in works:
                w.wait()
            kv = incoming
            rows, cols = _plan(t, r, cp, c)
            o_b, lse_b = _block_forward(qf[..., rows, :], kv[0][..., cols, :], kv[1][..., cols, :], scale, None)
            o_view, lse_view = out[..., rows, :], lse[..., rows]
            _merge(o_view, lse_view, o_b, lse_b)
        ctx.group, ctx.scale, ctx.dtype = group, scale, dtype
        ctx.save_for_backward(qf if q.dtype == torch.float32 else q, k, v, out, lse)
        return out.to(dtype)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        group, scale = ctx.group, ctx.scale
        cp, r = group.size, group.rank
        qf, dof = q.float(), dout.float()
        c = q.shape[-2] // 2
        nxt, prv = _ring_peers(group)
        d_row = (dof * out).sum(-1)  # D = rowsum(dO ∘ O)
        dq = torch.zeros_like(qf)
        kv = torch.stack([k.float(), v.float()]).contiguous()
        dkv = torch.zeros_like(kv)
        pending: list[Any] = []
        incoming_dkv: torch.Tensor | None = None
        for t in range(cp):
            works: list[Any] = []
            incoming = None
            if t < cp - 1:  # the next step's block travels while this one computes
                incoming = torch.empty_like(kv)
                works = comm.exchange(kv, nxt, incoming, prv, group, _TAG_KV)
            if t == 0:
                rows, cols, mask = slice(None), slice(None), _own_mask(cp, r, c, q.device)
            else:
                (rows, cols), mask = _plan(t, r, cp, c), None
            dq_b, dk_b, dv_b = _block_backward(qf[..., rows, :], kv[0][..., cols, :], kv[1][..., cols, :],
                                               dof[..., rows, :], lse[..., rows], d_row[..., rows], scale, mask)
            dq[..., rows, :] += dq_b
            if t > 0:  # the accumulator of this block arrives from the previous rank
                for w in pending:
                    w.wait()
                dkv = incoming_dkv  # type: ignore[assignment]
            dkv[0][..., cols, :] += dk_b
            dkv[1][..., cols, :] += dv_b
            # pass the accumulator on with its block (after the last step it is home again)
            incoming_dkv = torch.empty_like(dkv)
            pending = comm.exchange(dkv, nxt, incoming_dkv, prv, group, _TAG_DKV)
            for w in works:
                w.wait()
            if incoming is not None:
                kv = incoming
        for w in pending:
            w.wait()
        assert incoming_dkv is not None
        dk, dv = incoming_dkv[0], incoming_dkv[1]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Group) -> torch.Tensor:
    """Causal softmax(QKᵀ/√d)V over the whole sequence, for q, k, v [b, heads, 2c, d] holding this
    CP rank's two chunks; returns this rank's rows of the output."""
    return _RingAttention.apply(q, k, v, group)
