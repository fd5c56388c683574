"""Data parallelism: bucketed gradient reduction during backward, and the optimizer (ZeRO stage 0;
stages 1-3 are `zero.py`, which shares this module's AdamW arithmetic and learning-rate schedule).

Gradients are accumulated, over micro-batches, into one flat fp32 buffer per model chunk
(`main_grad`, as Megatron-LM does) by a hook that fires when a parameter's gradient is ready.
On the last micro-batch the hook also counts down its bucket; when a bucket is complete its DP
reduction starts at once (asynchronously), overlapping the rest of backward (seed 4.5 point 2:
the DP all-reduce happens once per step and can hide behind backward).

  each bucket is all-reduced over the ranks holding the same parameters (dp x cp); every rank
  updates every parameter.

The loss of every micro-batch is pre-divided by the number of tokens in the *global* batch, so
the DP reduction is a plain sum and the result is the gradient of the global mean loss.

Two kinds of parameter need a reduction over another group first:
  * sequence-parallel replicated parameters (LayerNorms, row biases, position embedding): each
    TP rank saw part of the sequence -> sum over TP (done in the hook: TP ranks run in lockstep);
  * the tied embedding held by the first and last pipeline stage -> sum over the embedding
    group; this waits for the pipeline flush (`finish`) because the stages reach it at
    different times, so those parameters live in a bucket of their own.  In the V schedules
    (zb-v, dualpipe-v) both copies are chunks of pipeline rank 0: summed there, with no
    communication (`tied_pair`), at the same point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from par3d import comm
from par3d.config import TrainConfig
from par3d.mesh import Groups


def _has_fused_adam() -> bool:
    """torch's fused AdamW kernel on this build (CPU support arrived in torch 2.4)?"""
    try:
        w, g, m, v = (torch.zeros(4) for _ in range(4))
        torch._fused_adamw_([w], [g], [m], [v], [], [torch.tensor(1.0)], lr=0.1, beta1=0.9, beta2=0.99,
                            weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        return True
    except (AttributeError, RuntimeError, NotImplementedError, TypeError):
        return False


_FUSED_ADAM = _has_fused_adam()


def tied_pair(chunks: list[nn.Module], groups: Groups) -> list[nn.Parameter]:
    """The two copies of a tied embedding where this rank holds both, in two chunks (the V schedules put the
    embedding's chunk and the head's on pipeline rank 0), else [].  Their gradients are summed on this rank
    after the flush, as the embedding group sums them when the copies are on two ranks."""
    if groups.embed.size > 1:
        return []
    copies = {id(p): p for ch in chunks for p in ch.parameters() if getattr(p, "tied_embedding", False)}
    return list(copies.values()) if len(copies) == 2 else []


def deferred_tied(params: list[nn.Parameter], groups: Groups, pair: list[nn.Parameter]) -> list[nn.Parameter]:
    """The copies of a tied embedding among `params` whose gradient waits for the flush, in a bucket of their own:
    summed over the embedding group (the copies on two ranks) or on this rank (`pair`, both copies here)."""
    if groups.embed.size == 1 and not pair:
        return []
    return [p for p in params if getattr(p, "tied_embedding", False)]


def sum_tied(a: torch.Tensor, b: torch.Tensor) -> None:
    """Both gradients of a rank's two tied copies become their sum (in place)."""
    a.add_(b)
    b.copy_(a)


def lr_schedule(t: TrainConfig, step: int) -> float:
    """Linear warm-up then cosine decay to min_lr over `steps`."""
    if t.warmup and step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    span = max(t.steps - t.warmup, 1)
    frac = min(max(step - t.warmup, 0) / span, 1.0)
    return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1 + math.cos(math.pi * frac))


def adam_terms(t: TrainConfig, norm: float, k: int) -> tuple[float, float, float]:
    """The scalars of AdamW step k (1-based) that every optimizer here shares: the gradient-clipping
    coefficient for a global norm `norm` and the two bias corrections 1 - beta^k (Loshchilov & Hutter)."""
    coef = min(1.0, t.grad_clip / (norm + 1e-6)) if t.grad_clip > 0 else 1.0
    return coef, 1 - t.beta1 ** k, 1 - t.beta2 ** k


@dataclass
class Bucket:
    chunk: int
    params: list[nn.Parameter]
    start: int  # offset into the chunk's flat buffers
    numel: int  # padded to a multiple of dp
    deferred: bool = False  # the tied-embedding bucket: reduced in finish()
    pending: int = 0
    work: Any = None
    launched: bool = False


@dataclass
class ChunkBuffers:
    params: list[nn.Parameter]
    grad: torch.Tensor  # fp32 main_grad, flat
    master: torch.Tensor  # fp32 master weights, flat
    decay_mask: torch.Tensor  # 1 where weight decay applies
    norm_mask: torch.Tensor  # 1 where this rank counts the element in the global gradient norm
    buckets: list[Bucket] = field(default_factory=list)
    offsets: dict[int, int] = field(default_factory=dict)  # id(param) -> offset in the flat buffers
    all_counted: bool = True  # every element counts in the norm: no mask needed
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None  # optimizer work buffers (allocated once)
    # (lo, hi) -> the slices of [lo, hi) with weight decay and those without (`_decay_runs`)
    decay_runs: dict[tuple[int, int], tuple[list[slice], list[slice]]] = field(default_factory=dict)


class DataParallel:
    """Owns gradient buffers, the DP reduction and the AdamW step for the model chunks held by this
    rank.  With dp == 1 it communicates nothing and is just the optimizer."""

    def __init__(self, chunks: list[nn.Module], groups: Groups, train: TrainConfig, zero_stage: int = 0,
                 bucket_numel: int = 1 << 20):
        if zero_stage != 0:
            raise ValueError(f"zero_stage={zero_stage}: DataParallel runs stage 0; zero.py runs 1-3")
        self.groups, self.train, self.zero = groups, train, zero_stage
        self.dp = groups.grad_group  # dp x cp: every rank holding these parameters
        self.sync = [False] * len(chunks)
        self.bufs: list[ChunkBuffers] = []
        self.step_count = 0
        self.tied_pair = tied_pair(chunks, groups)
        for ci, module in enumerate(chunks):
            self.bufs.append(self._build_chunk(ci, module, bucket_numel))
        # fp32 training: autograd accumulates straight into the flat buffer (param.grad *is* the
        # main_grad view) and the parameters *are* views of the master weights, so neither a
        # per-micro-batch copy of the gradients nor a per-step copy of the weights is needed.
        # (bf16 keeps separate bf16 parameters and gradients, converted in the hook / the step.)
        self.direct = all(p.dtype == torch.float32 for buf in self.bufs for p in buf.params)
        if self.direct:
            with torch.no_grad():
                for buf in self.bufs:
                    for p in buf.params:
                        o = buf.offsets[id(p)]
                        p.data = buf.master[o:o + p.numel()].view_as(p)
        self.exp_avg = [torch.zeros_like(buf.master) for buf in self.bufs]
        self.exp_avg_sq = [torch.zeros_like(buf.master) for buf in self.bufs]
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(ci, p, b))
                       for ci, buf in enumerate(self.bufs) for b in buf.buckets for p in b.params]

    # ---- layout ------------------------------------------------------------------------------
    def _build_chunk(self, ci: int, module: nn.Module, bucket_numel: int) -> ChunkBuffers:
        params = [p for p in module.parameters() if p.requires_grad]
        tied = deferred_tied(params, self.groups, self.tied_pair)
        regular = [p for p in params if not any(p is t for t in tied)]
        # backward visits parameters roughly in reverse creation order: bucket them that way so
        # the first buckets fill first
        groups_of: list[tuple[list[nn.Parameter], bool]] = []
        cur: list[nn.Parameter] = []
        cur_n = 0
        for p in reversed(regular):
            cur.append(p)
            cur_n += p.numel()
            if cur_n >= bucket_numel:
                groups_of.append((cur, False))
                cur, cur_n = [], 0
        if cur:
            groups_of.append((cur, False))
        if tied:
            groups_of.append((tied, True))
        dp = self.dp.size
        total = sum(int(math.ceil(sum(p.numel() for p in ps) / dp) * dp) for ps, _ in groups_of)
        dev = params[0].device if params else torch.device("cpu")
        grad = torch.zeros(total, dtype=torch.float32, device=dev)
        master = torch.zeros(total, dtype=torch.float32, device=dev)
        decay = torch.zeros(total, dtype=torch.float32, device=dev)
        norm = torch.zeros(total, dtype=torch.float32, device=dev)
        buckets: list[Bucket] = []
        offsets: dict[int, int] = {}
        off = 0
        tp_rank0 = self.groups.tp.rank == 0
        for ps, deferred in groups_of:
            start = off
            for p in ps:
                n = p.numel()
                offsets[id(p)] = off
                p.main_grad = grad[off:off + n].view_as(p)  # type: ignore[attr-defined]
                master[off:off + n] = p.detach().reshape(-1).float()
                decay[off:off + n] = 1.0 if p.dim() >= 2 else 0.0
                # count a replicated parameter once per TP group; the tied embedding once (the
                # embedding's copy, not the head's) per pipeline
                counted = (getattr(p, "tp_sharded", False) or tp_rank0)
                if getattr(p, "tied_copy", False):
                    counted = False
                norm[off:off + n] = 1.0 if counted else 0.0
                off += n
            padded = int(math.ceil((off - start) / dp) * dp)
            off = start + padded
            buckets.append(Bucket(ci, ps, start, padded, deferred))
        return ChunkBuffers(params, grad, master, decay, norm, buckets, offsets, bool(norm.min() == 1))

    # ---- backward-time hooks -------------------------------------------------------------------
    def _make_hook(self, ci: int, p: nn.Parameter, bucket: Bucket) -> Any:

        def hook(param: torch.Tensor) -> None:
            g = param.grad
            if g is not None and not (self.direct and g.data_ptr() == param.main_grad.data_ptr()):  # type: ignore[attr-defined]
                param.main_grad.add_(g.float())  # type: ignore[attr-defined]
                param.grad = None
                if self.direct:  # autograd replaced the buffer view; accumulate in place from now on
                    param.grad = param.main_grad  # type: ignore[attr-defined]
            if self.sync[ci] and not bucket.deferred:
                bucket.pending -= 1
                if bucket.pending == 0:
                    self._launch(bucket)

        return hook

    def set_sync(self, chunk: int, enabled: bool) -> None:
        """Call with True before the LAST backward of `chunk` in this step."""
        self.sync[chunk] = enabled

    def _launch(self, b: Bucket) -> None:
        if b.launched:
            return
        b.launched = True
        buf = self.bufs[b.chunk]
        # sequence-parallel replicas: sum the partial gradients over TP before the DP reduction
        for p in b.params:
            if getattr(p, "sequence_parallel", False) and self.groups.tp.size > 1:
                comm.all_reduce(p.main_grad, self.groups.tp)  # type: ignore[attr-defined]
        view = buf.grad[b.start:b.start + b.numel]
        b.work = None if self.dp.size == 1 else comm.all_reduce(view, self.dp, async_op=True)

    def start_step(self) -> None:
        for buf in self.bufs:
            buf.grad.zero_()
            if self.direct:
                for p in buf.params:
                    p.grad = p.main_grad  # type: ignore[attr-defined]
            for b in buf.buckets:
                b.pending, b.work, b.launched = len(b.params), None, False
        self.sync = [False] * len(self.bufs)

    def finish(self) -> None:
        """After the last backward: reduce what the hooks did not, then wait for everything."""
        if self.tied_pair:  # both copies here: summed on this rank (the embedding group is this rank alone)
            sum_tied(*(p.main_grad for p in self.tied_pair))  # type: ignore[attr-defined]
        for buf in self.bufs:
            for b in buf.buckets:
                if b.deferred:
                    for p in b.params:
                        comm.all_reduce(p.main_grad, self.groups.embed)  # type: ignore[attr-defined]
                if not b.launched:
                    self._launch(b)
        for buf in self.bufs:
            for b in buf.buckets:
                if b.work is not None:
                    b.work.wait()
                    b.work = None

    # ---- optimizer -----------------------------------------------------------------------------
    def _owned(self, buf: ChunkBuffers) -> list[tuple[int, int]]:
        return [(0, buf.grad.numel())]

    def _scratch(self, buf: ChunkBuffers) -> tuple[torch.Tensor, torch.Tensor]:
        """Two fp32 work buffers per chunk, allocated once: fresh multi-MB temporaries every step
        cost page faults and allocator time comparable to the arithmetic itself on a CPU."""
        if buf.scratch is None:
            n = max(hi - lo for lo, hi in self._owned(buf))
            buf.scratch = (torch.empty(n, dtype=torch.float32, device=buf.grad.device),
                           torch.empty(n, dtype=torch.float32, device=buf.grad.device))
        return buf.scratch

    def _decay_runs(self, buf: ChunkBuffers, lo: int, hi: int) -> tuple[list[slice], list[slice]]:
        """The maximal runs of [lo, hi) with weight decay and those without, from the decay mask
        (found once per slice: the mask never changes)."""
        if (lo, hi) not in buf.decay_runs:
            mask = buf.decay_mask[lo:hi].cpu()
            cuts = [0, *(torch.nonzero(mask[1:] != mask[:-1]).flatten() + 1).tolist(), hi - lo]
            runs: tuple[list[slice], list[slice]] = ([], [])
            for a, b in zip(cuts, cuts[1:]):
                if b > a:
                    runs[0 if mask[a] > 0 else 1].append(slice(lo + a, lo + b))
            buf.decay_runs[(lo, hi)] = runs
        return buf.decay_runs[(lo, hi)]

    def grad_norm(self) -> float:
        """Global L2 norm of the gradient of the whole model, each element counted once."""
        sq = torch.zeros(1, dtype=torch.float64, device=self.bufs[0].grad.device if self.bufs else "cpu")
        for buf in self.bufs:
            s1, _ = self._scratch(buf)
            for lo, hi in self._owned(buf):
                g = buf.grad[lo:hi] if buf.all_counted else torch.mul(buf.grad[lo:hi], buf.norm_mask[lo:hi],
                                                                  out=s1[:hi - lo])
                sq += torch.linalg.vector_norm(g).double() ** 2
        comm.all_reduce(sq, self.groups.tp)
        comm.all_reduce(sq, self.groups.pp)
        return float(sq.sqrt())

    def lr_at(self, step: int) -> float:
        return lr_schedule(self.train, step)

    def step(self, step: int) -> dict[str, Any]:
        """Clip, AdamW, write the parameters back (bf16).
        Returns {"grad_norm", "lr", "skipped"}; a non-finite norm skips the update."""
        t = self.train
        norm = self.grad_norm()
        lr = self.lr_at(step)
        if not math.isfinite(norm):
            return {"grad_norm": norm, "lr": lr, "skipped": True}
        self.step_count += 1
        k = self.step_count
        coef, bc1, bc2 = adam_terms(t, norm, k)
        for ci, buf in enumerate(self.bufs):
            m_all, v_all = self.exp_avg[ci], self.exp_avg_sq[ci]
            s1, s2 = self._scratch(buf)
            for lo, hi in self._owned(buf):
                n = hi - lo
                w, m, v = buf.master[lo:hi], m_all[lo:hi], v_all[lo:hi]
                if _FUSED_ADAM:
                    # one pass over w, g, m, v instead of ~8 (torch's fused AdamW kernel), the
                    # decoupled decay inside it: one call over the slices with decay, one over those
                    # without (a mask would cost three more passes).  Clipping enters as the kernel's
                    # gradient scale (it divides the gradient by it).
                    step_t = torch.tensor(float(k), device=w.device)
                    scale = torch.tensor(1.0 / coef, device=w.device) if coef != 1.0 else None
                    for runs, wd in zip(self._decay_runs(buf, lo, hi), (t.weight_decay, 0.0)):
                        if runs:
                            torch._fused_adamw_([buf.master[r] for r in runs], [buf.grad[r] for r in runs],
                                                [m_all[r] for r in runs], [v_all[r] for r in runs], [],
                                                [step_t] * len(runs), lr=lr, beta1=t.beta1, beta2=t.beta2,
                                                weight_decay=wd, eps=t.eps, amsgrad=False, maximize=False,
                                                grad_scale=scale, found_inf=None)
                    continue
                # decoupled decay (AdamW) first, as torch.optim.AdamW: w *= 1 - lr·wd·mask
                w.mul_(torch.mul(buf.decay_mask[lo:hi], -(lr * t.weight_decay), out=s1[:n]).add_(1.0))
                g = torch.mul(buf.grad[lo:hi], coef, out=s1[:n])
                m.mul_(t.beta1).add_(g, alpha=1 - t.beta1)
                v.mul_(t.beta2).addcmul_(g, g, value=1 - t.beta2)
                denom = torch.div(v, bc2, out=s2[:n]).sqrt_().add_(t.eps)
                w.addcdiv_(m, denom, value=-lr / bc1)
            self._write_params(buf)
        return {"grad_norm": norm, "lr": lr, "skipped": False}

    # ---- the interface checkpoints, reports and the runtime share with zero.ShardedDataParallel --
    def full_flat(self, kind: str, ci: int) -> torch.Tensor:
        """The chunk's `kind` ("model", "exp_avg", "exp_avg_sq", "grad") over its whole flat layout
        (fp32; every rank holds all of it at stage 0, so no communication)."""
        buf = self.bufs[ci]
        return {"model": buf.master, "grad": buf.grad, "exp_avg": self.exp_avg[ci],
                "exp_avg_sq": self.exp_avg_sq[ci]}[kind]

    def flat_numel(self, ci: int) -> int:
        return self.bufs[ci].master.numel()

    def load_flat(self, kind: str, ci: int, full: torch.Tensor) -> None:
        buf = self.bufs[ci]
        dst = {"model": buf.master, "exp_avg": self.exp_avg[ci], "exp_avg_sq": self.exp_avg_sq[ci]}[kind]
        with torch.no_grad():
            dst.copy_(full)
            if kind == "model":
                for p in buf.params:
                    o = buf.offsets[id(p)]
                    p.copy_(buf.master[o:o + p.numel()].view_as(p))

    def finite(self) -> bool:
        return all(bool(torch.isfinite(t).all()) for t in (*(b.master for b in self.bufs), *self.exp_avg,
                                                           *self.exp_avg_sq))

    def gathered(self) -> Any:
        """Context in which every parameter holds its full weights (always, here)."""
        import contextlib

        return contextlib.nullcontext()

    def before_backward(self, chunk: int) -> None:
        """(ZeRO-3 gathers here; nothing to do without it.)"""

    def after_backward(self, chunk: int) -> None:
        """(ZeRO-3 frees here.)"""

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds: weights (the parameters; in fp32 they are the master weights),
        gradients (the fp32 main_grad buffers), optimizer state (Adam m, v, and the fp32 master
        weights when the parameters are bf16)."""
        weights = sum(p.numel() * p.element_size() for buf in self.bufs for p in buf.params)
        grads = sum(buf.grad.numel() * 4 for buf in self.bufs)
        opt = sum(t.numel() * 4 for t in (*self.exp_avg, *self.exp_avg_sq))
        if not self.direct:
            opt += sum(buf.master.numel() * 4 for buf in self.bufs)
        return {"weights": weights, "grads": grads, "optimizer": opt, "gathered_weights_peak": 0,
                "grad_buckets_peak": 0}

    def _write_params(self, buf: ChunkBuffers) -> None:
        if self.direct:
            return  # the parameters are views of the master weights
        with torch.no_grad():
            for p in buf.params:
                o = buf.offsets[id(p)]
                p.copy_(buf.master[o:o + p.numel()].view_as(p))
