"""A GPT or Llama-style transformer built from tensor-parallel layers, cut into pipeline units.

Read top to bottom: Embedding -> Block x L -> Head.  The model is a list of *units*

    unit 0          Embedding   token (vocab-parallel) [+ learned position embedding]
    units 1..L      Block       pre-norm causal self-attention and MLP, each with a residual
    unit L+1        Head        final norm, LM head (vocab-parallel), cross-entropy

and a pipeline stage (`GPTStage`) is a contiguous range of units.  With a TP group of size one
and one stage holding every unit, this *is* the single-device reference model.

The architecture is configuration (`ModelConfig`, filled from `arch` by `fill_arch`):
  gpt    LayerNorm, learned positions, GeLU MLP h->4h->h, biases (GPT-2; Radford et al. 2019)
  llama  RMSNorm (Zhang & Sennrich 2019), rotary positions on Q and K (Su et al. 2021), SwiGLU
         MLP (Shazeer 2020), grouped-query attention with kv_heads K/V heads (Ainslie et al.
         2023), no biases, untied embeddings (Touvron et al. 2023)
and each switch can be set alone (e.g. a GPT-2 with gelu_tanh, the `gelu_new` of its checkpoints).

Tensor parallelism inside a block follows the seed's figure 2 (section 2.3):
  attention: Q, K, V column-parallel (each rank owns heads/E whole heads), W_o row-parallel
  MLP:       fc1 column-parallel -> activation (elementwise, no communication) -> fc2 row-parallel
             (gated: fc1 holds [gate | up], each rank its rows of both, so act(g)·u stays local)
so a block does exactly 2 all-reduces of b·s·h forward (after W_o and fc2, the g operators)
and 2 backward (before QKV and fc1, the f operators).  With sequence parallelism (Korthikanti
et al. 2022) the norms run on sequence shards and each all-reduce becomes a reduce-scatter +
all-gather pair.  Grouped-query attention splits the kv_heads K/V heads over TP ranks; when
tp > kv_heads each rank holds all K/V weights (replicated, as Megatron-LM does) and uses its
group's head, and the partial gradients of the replicas are summed over TP.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from par3d import comm, context_parallel, rng
from par3d.config import ModelConfig
from par3d.mesh import Group
from par3d.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    full_init,
    mark_sequence_parallel,
    mark_tp_partial,
    mark_tp_sharded,
    padded_vocab,
    unshard,
    vocab_parallel_cross_entropy,
)
from par3d.weight_grad import linear


@dataclass
class ModelContext:
    """How this copy of the model is parallelised (everything but the shapes)."""

    tp: Group
    seed: int = 0
    sequence_parallel: bool = False
    recompute: str = "none"  # none | selective (attention core) | full (whole block)
    dtype: torch.dtype = torch.float32
    cp: Group | None = None  # context parallelism (context_parallel.py); None or size 1: whole sequences

    @property
    def cp_size(self) -> int:
        return 1 if self.cp is None else self.cp.size


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · w, computed in fp32 (no mean subtraction, no bias)."""

    def __init__(self, hidden: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def _norm(cfg: ModelConfig, ctx: ModelContext) -> nn.Module:
    norm: nn.Module
    if cfg.norm == "rmsnorm":
        norm = RMSNorm(cfg.hidden, float(cfg.norm_eps or 1e-6), ctx.dtype)
    else:
        norm = nn.LayerNorm(cfg.hidden, eps=float(cfg.norm_eps or 1e-5), dtype=ctx.dtype)
    if ctx.sequence_parallel and ctx.tp.size > 1:
        for p in norm.parameters():
            mark_sequence_parallel(p)
    return norm


def _activation(name: str | None) -> Any:
    if name == "silu":
        return F.silu
    if name == "gelu_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    return F.gelu


def rotary(x: torch.Tensor, theta: float, positions: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of [b, heads, s, d] at `positions` [s] (Su et al. 2021): channel
    pairs (i, i + d/2) turn by angle pos·theta^(-2i/d) — the half-split pairing of Hugging Face's
    Llama, so its checkpoints' Q/K weights are used as they are."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = torch.outer(positions.to(device=x.device, dtype=torch.float32), inv_freq)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    x1, x2 = x.float().chunk(2, dim=-1)
    return (x.float() * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


class Embedding(nn.Module):
    def __init__(self, cfg: ModelConfig, ctx: ModelContext):
        super().__init__()
        self.ctx = ctx
        self.sp = ctx.sequence_parallel and ctx.tp.size > 1
        self.tok = VocabParallelEmbedding(cfg.vocab, cfg.hidden, ctx.tp, seed=ctx.seed, name="embed.tok",
                                          sequence_parallel=self.sp, dtype=ctx.dtype)
        if cfg.tied_embeddings:
            self.tok.weight.tied_embedding = True  # type: ignore[attr-defined]
        self.pos: nn.Parameter | None = None
        if cfg.position == "learned":
            pos = full_init((cfg.positions, cfg.hidden), 0.01, ctx.seed, "embed.pos").to(ctx.dtype)
            self.pos = nn.Parameter(pos)
            if self.sp:
                mark_sequence_parallel(self.pos)
        self.drop = rng.Dropout(cfg.dropout, ctx.tp, sharded=self.sp)  # SP: each rank its sequence shard

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)  # [b, s, h], or [b, s/E, h] with sequence parallelism
        s = tokens.shape[1]
        if self.pos is None:  # rotary positions act inside attention
            return self.drop(x)
        pos = self.pos[:s]
        if self.ctx.cp_size > 1:  # this CP rank's two chunks of the sequence (context_parallel.py)
            pos = self.pos[context_parallel.local_positions(s * self.ctx.cp_size, self.ctx.cp_size,
                                                            self.ctx.cp.rank)]  # type: ignore[union-attr]
        if self.sp:
            n = s // self.ctx.tp.size
            pos = pos[self.ctx.tp.rank * n:(self.ctx.tp.rank + 1) * n]
        return self.drop(x + pos)


class ReplicatedKV(nn.Module):
    """K|V projection when tp > kv_heads: every TP rank holds all 2·kv_heads·d rows (the full
    weight, as at tp=1) and computes only those of K/V head `group`, the one its query heads share.
    Each rank's gradient covers its head's rows only: summed over TP after backward."""

    def __init__(self, cfg: ModelConfig, ctx: ModelContext, name: str, group: int):
        super().__init__()
        hd, out = cfg.head_dim, 2 * cfg.kv * cfg.head_dim
        w = full_init((out, cfg.hidden), 0.02, ctx.seed, name + ".weight").to(ctx.dtype)
        self.weight = mark_tp_partial(nn.Parameter(w))
        self.bias = mark_tp_partial(nn.Parameter(torch.zeros(out, dtype=ctx.dtype))) if cfg.bias else None
        k_rows = torch.arange(group * hd, (group + 1) * hd)
        self.register_buffer("rows", torch.cat([k_rows, k_rows + cfg.kv * hd]), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # plain F.linear, not weight_grad.linear: the weight here is a slice (a non-leaf), whose
        # graph a deferred weight GEMM could not reach after BI; its gradient is computed in BI
        return F.linear(x, self.weight[self.rows], self.bias[self.rows] if self.bias is not None else None)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, ctx: ModelContext, name: str, n_layers: int):
        super().__init__()
        self.ctx, self.sp = ctx, ctx.sequence_parallel and ctx.tp.size > 1
        tp, h, bias = ctx.tp.size, cfg.hidden, bool(cfg.bias)
        self.head_dim = hd = cfg.hidden // cfg.heads
        self.local_heads = cfg.heads // tp
        self.rope_theta = cfg.rope_theta if cfg.position == "rope" else None
        kw: dict[str, Any] = dict(seed=ctx.seed, sequence_parallel=self.sp, dtype=ctx.dtype, bias=bias)
        resid_std = 0.02 / math.sqrt(2 * n_layers)  # GPT-2's scaling of residual projections
        self.qkv = self.q = self.kv = None
        if cfg.kv == cfg.heads:  # multi-head: one Q|K|V projection, each rank its heads' rows of each
            self.local_kv = self.local_heads
            self.qkv = ColumnParallelLinear(h, 3 * h, ctx.tp, name=name + ".qkv", stride=3, **kw)
        else:  # grouped-query: Q and K|V apart (they differ in size); x enters the TP region once
            self.q = ColumnParallelLinear(h, h, ctx.tp, name=name + ".q", enter=False, **kw)
            kv_out = 2 * cfg.kv * hd
            self.kv_replicated = tp > cfg.kv
            if self.kv_replicated:
                self.local_kv = 1
                group = (ctx.tp.rank * self.local_heads) // (cfg.heads // cfg.kv)
                self.kv = ReplicatedKV(cfg, ctx, name + ".kv", group)
            else:
                self.local_kv = cfg.kv // tp
                self.kv = ColumnParallelLinear(h, kv_out, ctx.tp, name=name + ".kv", stride=2, enter=False, **kw)
        self.proj = RowParallelLinear(h, h, ctx.tp, name=name + ".proj", std=resid_std, **kw)
        self.drop = rng.Dropout(cfg.dropout, ctx.tp, sharded=self.sp)
        self.p_drop = cfg.dropout

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(QKᵀ/√d)V per head — the part selective recomputation drops and redoes.  With
        fewer K/V heads, query head j reads K/V head j // (heads/kv_heads)."""
        if k.shape[1] != q.shape[1]:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if self.ctx.cp_size > 1:  # the sequence is split over CP ranks: a ring of K/V blocks
            return context_parallel.ring_attention(q, k, v, self.ctx.cp)  # type: ignore[arg-type]
        p_drop = self.p_drop if self.training else 0.0
        with rng.tp_sharded(self.ctx.tp, q.device, active=p_drop > 0):  # each rank its own heads' mask
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p_drop)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's heads' Q [b, s, H/E·d] and K, V [b, s, local_kv·d]."""
        if self.qkv is not None:
            return self.qkv(x).chunk(3, dim=-1)
        x = comm.gather_from_seq(x, self.ctx.tp) if self.sp else comm.copy_to_tp(x, self.ctx.tp)
        k, v = self.kv(x).chunk(2, dim=-1)
        return self.q(x), k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._project(x)
        b, s, _ = q.shape
        q = q.view(b, s, self.local_heads, self.head_dim).transpose(1, 2)
        k, v = (t.view(b, s, self.local_kv, self.head_dim).transpose(1, 2) for t in (k, v))
        if self.rope_theta is not None:
            # global positions: 0..s-1, or this CP rank's two chunks of the sequence
            pos = (torch.arange(s) if self.ctx.cp_size == 1 else torch.tensor(context_parallel.local_positions(
                s * self.ctx.cp_size, self.ctx.cp_size, self.ctx.cp.rank)))  # type: ignore[union-attr]
            q, k = rotary(q, self.rope_theta, pos), rotary(k, self.rope_theta, pos)
        if self.ctx.recompute == "selective":
            out = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            out = self.core(q, k, v)
        out = out.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim)
        return self.drop(self.proj(out))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, ctx: ModelContext, name: str, n_layers: int):
        super().__init__()
        sp, bias = ctx.sequence_parallel and ctx.tp.size > 1, bool(cfg.bias)
        self.gated, self.act = bool(cfg.gated_mlp), _activation(cfg.activation)
        n_in = 2 if self.gated else 1  # gated: fc1 = [gate | up], split over TP block by block
        self.fc1 = ColumnParallelLinear(cfg.hidden, n_in * cfg.ffn, ctx.tp, seed=ctx.seed, name=name + ".fc1",
                                        stride=n_in, bias=bias, sequence_parallel=sp, dtype=ctx.dtype)
        self.fc2 = RowParallelLinear(cfg.ffn, cfg.hidden, ctx.tp, seed=ctx.seed, name=name + ".fc2", bias=bias,
                                     std=0.02 / math.sqrt(2 * n_layers), sequence_parallel=sp, dtype=ctx.dtype)
        self.drop = rng.Dropout(cfg.dropout, ctx.tp, sharded=sp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the activation acts on this rank's columns only: GeLU(XA₁) ‖ GeLU(XA₂) = GeLU(X[A₁ A₂]) (seed Q2)
        y = self.fc1(x)
        if self.gated:
            gate, up = y.chunk(2, dim=-1)
            return self.drop(self.fc2(self.act(gate) * up))
        return self.drop(self.fc2(self.act(y)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, ctx: ModelContext, index: int):
        super().__init__()
        self.ctx = ctx
        name = f"blocks.{index}"
        self.ln1 = _norm(cfg, ctx)
        self.attn = Attention(cfg, ctx, name + ".attn", cfg.layers)
        self.ln2 = _norm(cfg, ctx)
        self.mlp = MLP(cfg, ctx, name + ".mlp", cfg.layers)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ctx.recompute == "full" and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class Head(nn.Module):
    """Final norm, vocabulary-parallel LM head and loss.  Returns per-token losses [b, s]."""

    def __init__(self, cfg: ModelConfig, ctx: ModelContext, tied_weight: nn.Parameter | None = None):
        super().__init__()
        self.ctx, self.vocab = ctx, cfg.vocab
        self.sp = ctx.sequence_parallel and ctx.tp.size > 1
        self.ln_f = _norm(cfg, ctx)
        per = padded_vocab(cfg.vocab, ctx.tp.size) // ctx.tp.size
        self.vocab_start = ctx.tp.rank * per
        if tied_weight is not None:
            self.weight = tied_weight  # the embedding table itself (same stage)
        else:
            # a separate copy: either untied, or tied across pipeline stages (same init key as the
            # embedding; the two copies' gradients are summed over the embedding group)
            key = "embed.tok" if cfg.tied_embeddings else "head"
            full = torch.zeros(per * ctx.tp.size, cfg.hidden)
            full[:cfg.vocab] = full_init((cfg.vocab, cfg.hidden), 0.02, ctx.seed, key + ".weight")
            w = full[self.vocab_start:self.vocab_start + per].contiguous().to(ctx.dtype)
            self.weight = mark_tp_sharded(nn.Parameter(w))
            if cfg.tied_embeddings:
                self.weight.tied_embedding = True  # type: ignore[attr-defined]
                self.weight.tied_copy = True  # type: ignore[attr-defined]  # the second copy: counted once

    def logits_local(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_f(x)
        x = comm.gather_from_seq(x, self.ctx.tp) if self.sp else comm.copy_to_tp(x, self.ctx.tp)
        return linear(x, self.weight)  # [b, s, V_pad/E]

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(self.logits_local(x), targets, self.ctx.tp,
                                            self.vocab_start, self.vocab)

    def full_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Gathered logits [b, s, V] — for tests and inspection only (training never gathers)."""
        return comm.gather_last(self.logits_local(x), self.ctx.tp)[..., :self.vocab]


def n_units(cfg: ModelConfig) -> int:
    return cfg.layers + 2


class GPTStage(nn.Module):
    """Units [start, end) of the model (GPT or Llama-style).  The first stage takes tokens; the last returns per-token
    losses; the others map activations to activations."""

    def __init__(self, cfg: ModelConfig, ctx: ModelContext, start: int = 0, end: int | None = None):
        super().__init__()
        cfg = dataclasses.replace(cfg).fill_arch()  # a copy: the caller's config stays as given
        end = n_units(cfg) if end is None else end
        if not 0 <= start < end <= n_units(cfg):
            raise ValueError(f"unit range [{start}, {end}) outside 0..{n_units(cfg)}")
        self.cfg, self.ctx, self.start, self.end = cfg, ctx, start, end
        self.is_first, self.is_last = start == 0, end == n_units(cfg)
        self.embedding = Embedding(cfg, ctx) if self.is_first else None
        self.blocks = nn.ModuleList(Block(cfg, ctx, i) for i in range(max(start, 1) - 1, min(end, cfg.layers + 1) - 1))
        tied = self.embedding.tok.weight if (self.is_first and cfg.tied_embeddings) else None
        self.head = Head(cfg, ctx, tied) if self.is_last else None

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            if targets is None:
                raise ValueError("the last stage needs targets")
            return self.head(x, targets)
        return x

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits of a whole model (single stage) — for tests."""
        assert self.embedding is not None and self.head is not None
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head.full_logits(x)


# ---- parameters by layout-independent names (checkpoints, tests, inspection) ---------------------

# Parameters whose rows are the vocabulary: padded to a multiple of TP inside, `vocab` rows outside.
VOCAB_PARAMS = ("embedding.tok.weight", "head.weight")


def global_named_parameters(stage: GPTStage) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) with block indices made global, so names do not depend on the split."""
    first_block = max(stage.start, 1) - 1
    out = []
    for name, p in stage.named_parameters():
        if name.startswith("blocks."):
            _, idx, rest = name.split(".", 2)
            name = f"blocks.{int(idx) + first_block}.{rest}"
        out.append((name, p))
    return out


def full_tensor(name: str, local: torch.Tensor, p: nn.Parameter, tp: Group, vocab: int) -> torch.Tensor:
    """The full fp32 CPU copy of `local` (parameter `name`'s weights, gradient or optimizer state on
    this rank): TP slices gathered (`unshard`: a collective over `tp`), vocabulary padding dropped.
    The one unsharding used by checkpoints and by the captured parameters/gradients of a run."""
    full = unshard(local, p, tp)
    if name in VOCAB_PARAMS:
        full = full[:vocab]
    return full.detach().float().cpu().clone()
