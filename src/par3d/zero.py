"""ZeRO stages 1-3 over the data-parallel (x context-parallel) group (Rajbhandari et al. 2020).

The d ranks of `Groups.grad_group` hold the same parameters.  Each *bucket* is a flat range of
one model chunk's parameters, padded to a multiple of d; rank k owns slice k of every bucket and
keeps the optimizer state (Adam m, v; and the fp32 master weights when training in bf16) of its
slices only.

  stage 1  gradients accumulate over micro-batches in a full-size fp32 buffer per bucket; on the
           last micro-batch each bucket is reduce-scattered as soon as it is complete; after the
           update the new parameters are all-gathered.                        (grads full)
  stage 2  every micro-batch's backward reduce-scatters each bucket as soon as it is complete and
           adds the owned slice to a sharded accumulator; the full-size bucket exists only from
           its first gradient to the end of its reduction.                     (grads / d)
  stage 3  also the parameters: a bucket is one unit of the model (the embedding, one block, the
           head), all-gathered just before its forward and again before its backward, one unit
           prefetched ahead (the next in forward, the previous in backward), its storage freed
           after use.                                                          (weights / d)

Why our own and not torch's FSDP2 (`fully_shard`): FSDP2 shards DTensors over a DeviceMesh, and
its pre-backward and post-backward hooks assume the module's backward runs as one autograd call.
Our TP layers are plain parameters with hand-written f/g operators (not DTensor), our pipeline
runs zero-bubble's BI and BW as two autograd walks over a retained graph, sends activations
through shared memory, and the tied embedding is summed over the pipeline's first and last stage
(or, in the V schedules, over rank 0's two chunks) before the DP reduction.  Composing those with FSDP2 would mean rewriting the TP layers as DTensor
plans and the runtime's backward; the mechanism below is small and shares the bucket layout,
checkpoint format and optimizer arithmetic with `data_parallel.py` (same offsets, same AdamW).

Mechanics of stage 3: a unit's parameters are views of one flat buffer (`Bucket.full`) whose
*storage* is resized to 0 bytes when the unit is freed and back when it is gathered — the views,
and the tensors autograd saved for backward (the weights themselves), stay valid across the
round trip (FSDP1's trick).  Gathers are hooked on the unit: a forward pre-hook (gather, prefetch
the next unit), a forward hook (free), a hook on the unit's output gradient (gather, free the unit
after it, prefetch the one before), and the pipeline runtime's before/after-backward calls (the
first unit to back-propagate is gathered before the walk starts; all are freed after it).

Gradients (stages 2, 3): a parameter's post-accumulate hook adds its gradient into its bucket's
full-size staging buffer and drops `.grad`; the bucket's last gradient of the micro-batch
launches the asynchronous reduce-scatter, whose result is added to the owned slice when the next
backward reaches the bucket or in `finish`.  (Stage 1 keeps the staging buffer across micro-batches
and reduces once.)  The tied embedding across pipeline stages waits for the flush (`finish`), as
in `data_parallel.py`; under stage 3 such buckets, and a weight shared by two units of one stage,
stay gathered (their weights are not sharded).

Measured memory (`memory()`): bytes of the tensors each category really holds on this rank —
weights, gradients, optimizer state persistently, and the peaks of the transient buffers (stage
3's gathered units, stage 2/3's staging buckets) — set beside plan/memory.py's prediction in the
end-of-run report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from par3d import comm
from par3d.config import TrainConfig
from par3d.data_parallel import _FUSED_ADAM, adam_terms, deferred_tied, lr_schedule, sum_tied, tied_pair
from par3d.mesh import Groups


@dataclass
class Bucket:
    chunk: int
    index: int
    params: list[nn.Parameter]
    start: int  # offset in the chunk's (unsharded) flat layout: the checkpoint's offsets
    numel: int  # padded to a multiple of d
    deferred: bool = False  # tied embedding across stages: reduced in finish()
    resident: bool = True  # the full weights stay allocated (always under stages 1-2)
    shard_off: int = 0  # where this rank's slice sits in the chunk's shard-space tensors
    full: torch.Tensor | None = None  # the unsharded weights (params are views of it)
    gbuf: torch.Tensor | None = None  # full-size fp32 gradient staging
    pending: int = 0
    work: Any = None
    scratch: torch.Tensor | None = None  # where the reduce-scatter lands
    gather_work: Any = None
    gathered: bool = True
    unit: Any = None  # stage 3: the module whose forward/backward needs this bucket gathered


@dataclass
class Chunk:
    params: list[nn.Parameter]
    buckets: list[Bucket]
    offsets: dict[int, int]  # id(param) -> offset in the unsharded flat layout
    total: int
    shard_n: int  # elements this rank owns in the chunk: total / d
    master: torch.Tensor  # see ShardedDataParallel.__init__
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    gshard: torch.Tensor | None  # stages 2-3: the owned slices of the gradient, accumulated
    decay: torch.Tensor  # shard space: 1 where weight decay applies
    norm: torch.Tensor  # shard space: 1 where this rank counts the element in the norm
    lowp_shard: torch.Tensor | None = None  # stage 3, bf16: the owned slices in the compute dtype
    units: list[Bucket] = field(default_factory=list)  # stage 3: gathered buckets in forward order


class _Ledger:
    """Live and peak bytes of the transient buffers (gathered units, gradient staging)."""

    def __init__(self) -> None:
        self.live: dict[str, int] = {"gathered": 0, "staging": 0}
        self.peak: dict[str, int] = {"gathered": 0, "staging": 0}

    def add(self, kind: str, n: int) -> None:
        self.live[kind] += n
        self.peak[kind] = max(self.peak[kind], self.live[kind])


class ShardedDataParallel:
    """The same interface as `DataParallel` (start_step, set_sync, finish, step, lr_at, grad_norm,
    full_flat, load_flat, memory) for ZeRO stages 1-3 over a group of d > 1 ranks."""

    def __init__(self, chunks: list[nn.Module], groups: Groups, train: TrainConfig, zero_stage: int,
                 bucket_numel: int = 1 << 20):
        if zero_stage not in (1, 2, 3):
            raise ValueError(f"zero_stage={zero_stage}: ShardedDataParallel runs stages 1-3")
        self.groups, self.train, self.zero = groups, train, zero_stage
        self.dp = groups.grad_group
        self.d, self.k = self.dp.size, self.dp.rank
        self.step_count = 0
        self.sync = [False] * len(chunks)
        self.ledger = _Ledger()
        self.lowp = next((p.dtype for c in chunks for p in c.parameters()), torch.float32)
        self.tied_pair = tied_pair(chunks, groups)  # both tied copies on this rank (a V): summed here
        self.fp32 = self.lowp == torch.float32
        self.chunks = [self._build(ci, m, bucket_numel) for ci, m in enumerate(chunks)]
        self.bufs = self.chunks  # the name checkpoint.py and the fault hooks use
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_hook(b, p))
                       for c in self.chunks for b in c.buckets for p in b.params]
        if self.zero == 3:
            for c in self.chunks:
                self._install_unit_hooks(c)

    # ---- layout ------------------------------------------------------------------------------
    def _groups_of(self, module: nn.Module, bucket_numel: int) -> list[tuple[list[nn.Parameter], bool, Any]]:
        """(params, deferred, unit module) per bucket.  Stages 2-3: one bucket per unit (stage 3
        gathers by unit); stage 1: by size, in reverse order (backward fills the first first)."""
        params = [p for p in module.parameters() if p.requires_grad]
        tied = deferred_tied(params, self.groups, self.tied_pair)
        is_tied = {id(p) for p in tied}
        out: list[tuple[list[nn.Parameter], bool, Any]] = []
        if self.zero == 1:
            cur: list[nn.Parameter] = []
            for p in reversed([p for p in params if id(p) not in is_tied]):
                cur.append(p)
                if sum(q.numel() for q in cur) >= bucket_numel:
                    out.append((cur, False, None))
                    cur = []
            if cur:
                out.append((cur, False, None))
        else:
            units = [u for u in (getattr(module, "embedding", None), *getattr(module, "blocks", []),
                                 getattr(module, "head", None)) if u is not None]
            count: dict[int, int] = {}
            for u in units:
                for p in u.parameters():
                    count[id(p)] = count.get(id(p), 0) + 1
            shared = [p for p in params if count.get(id(p), 0) > 1 and id(p) not in is_tied]
            skip = is_tied | {id(p) for p in shared}
            for u in units:
                ps = [p for p in u.parameters() if p.requires_grad and id(p) not in skip]
                if ps:
                    out.append((ps, False, u))
            if shared:
                out.append((shared, False, None))
        if tied:
            out.append((tied, True, None))
        return out

    def _build(self, ci: int, module: nn.Module, bucket_numel: int) -> Chunk:
        d, k = self.d, self.k
        specs = self._groups_of(module, bucket_numel)
        dev = next(module.parameters()).device
        buckets: list[Bucket] = []
        offsets: dict[int, int] = {}
        off = 0
        for i, (ps, deferred, unit) in enumerate(specs):
            raw = sum(p.numel() for p in ps)
            b = Bucket(ci, i, ps, off, int(math.ceil(raw / d) * d), deferred)
            b.resident = not (self.zero == 3 and unit is not None)
            b.shard_off = (off // d)
            for p in ps:
                offsets[id(p)] = off
                off += p.numel()
            off = b.start + b.numel
            b.unit = unit
            buckets.append(b)
        total = off
        shard_n = total // d
        f32 = dict(dtype=torch.float32, device=dev)
        decay = torch.zeros(shard_n, **f32)
        norm = torch.zeros(shard_n, **f32)
        full_master = torch.zeros(total, **f32)  # built once, then cut: only this rank's slices stay
        tp_rank0 = self.groups.tp.rank == 0
        full_decay, full_norm = torch.zeros(total, **f32), torch.zeros(total, **f32)
        for p in (p for b in buckets for p in b.params):
            o, n = offsets[id(p)], p.numel()
            full_master[o:o + n] = p.detach().reshape(-1).float()
            full_decay[o:o + n] = 1.0 if p.dim() >= 2 else 0.0
            counted = getattr(p, "tp_sharded", False) or tp_rank0
            if getattr(p, "tied_copy", False):
                counted = False  # the head's copy: the tied embedding is counted once, as the embedding
            full_norm[o:o + n] = 1.0 if counted else 0.0
        for b in buckets:
            n = b.numel // d
            lo = b.start + k * n
            decay[b.shard_off:b.shard_off + n] = full_decay[lo:lo + n]
            norm[b.shard_off:b.shard_off + n] = full_norm[lo:lo + n]
        # weights: stages 1-2 (and stage 3's resident buckets) keep each bucket's full weights in
        # b.full (the compute dtype); in fp32 the owned slice of b.full *is* the master weight.
        # Stage 3's gathered buckets keep only the owned slice: `master` (fp32) in shard space.
        for b in buckets:
            b.full = torch.zeros(b.numel, dtype=self.lowp, device=dev)
            b.full[:] = full_master[b.start:b.start + b.numel].to(self.lowp)
            with torch.no_grad():
                for p in b.params:
                    o = offsets[id(p)] - b.start
                    p.data = b.full[o:o + p.numel()].view_as(p)
        master_needed = not self.fp32 or self.zero == 3
        master = torch.zeros(shard_n if master_needed else 0, **f32)
        if master_needed:
            for b in buckets:
                n = b.numel // d
                master[b.shard_off:b.shard_off + n] = full_master[b.start + k * n:b.start + (k + 1) * n]
        c = Chunk([p for b in buckets for p in b.params], buckets, offsets, total, shard_n, master,
                  torch.zeros(shard_n, **f32), torch.zeros(shard_n, **f32),
                  torch.zeros(shard_n, **f32) if self.zero >= 2 else None, decay, norm)
        if self.zero == 1:
            for b in buckets:  # the full-size gradient accumulator, kept across micro-batches
                b.gbuf = torch.zeros(b.numel, **f32)
        if self.zero == 3:
            if not self.fp32:
                c.lowp_shard = master.to(self.lowp)
            c.units = [b for b in buckets if not b.resident]
            for b in c.units:  # sharded from the start (not counted as a gather)
                b.full.untyped_storage().resize_(0)  # type: ignore[union-attr]
                b.gathered = False
        return c

    # ---- views of one bucket's owned slice ---------------------------------------------------
    def _slice(self, b: Bucket) -> tuple[int, int]:
        n = b.numel // self.d
        return b.shard_off, b.shard_off + n

    def _master_of(self, c: Chunk, b: Bucket) -> torch.Tensor:
        """The fp32 master weights of the owned slice (a view)."""
        if self.fp32 and b.resident:
            n = b.numel // self.d
            return b.full[self.k * n:(self.k + 1) * n]  # type: ignore[index]
        lo, hi = self._slice(b)
        return c.master[lo:hi]

    def _grad_of(self, c: Chunk, b: Bucket) -> torch.Tensor:
        if self.zero == 1:
            n = b.numel // self.d
            return b.gbuf[self.k * n:(self.k + 1) * n]  # type: ignore[index]
        lo, hi = self._slice(b)
        return c.gshard[lo:hi]  # type: ignore[index]

    # ---- stage 3: gather and free ------------------------------------------------------------
    def _src_of(self, c: Chunk, b: Bucket) -> torch.Tensor:
        lo, hi = self._slice(b)
        return (c.master if self.fp32 else c.lowp_shard)[lo:hi]  # type: ignore[index]

    def _gather(self, b: Bucket, async_op: bool) -> None:
        if b.gathered or b.gather_work is not None:
            return
        full = b.full
        assert full is not None
        full.untyped_storage().resize_(full.numel() * full.element_size())
        self.ledger.add("gathered", full.numel() * full.element_size())
        src = self._src_of(self.chunks[b.chunk], b)
        b.gather_work = comm.all_gather_into(full, src, self.dp, async_op=True)
        if not async_op:
            self._wait_gather(b)

    def _wait_gather(self, b: Bucket) -> None:
        if b.gather_work is not None:
            b.gather_work.wait()
            b.gather_work = None
            b.gathered = True
        elif not b.gathered:
            self._gather(b, async_op=False)

    def _free(self, b: Bucket) -> None:
        if b.resident or (not b.gathered and b.gather_work is None):
            return
        if b.gather_work is not None:
            self._wait_gather(b)
        full = b.full
        assert full is not None
        if full.untyped_storage().nbytes():
            self.ledger.add("gathered", -full.untyped_storage().nbytes())
        full.untyped_storage().resize_(0)
        b.gathered = False

    def _install_unit_hooks(self, c: Chunk) -> None:
        units = c.units
        for i, b in enumerate(units):
            mod = b.unit

            def pre_forward(_m: Any, _args: Any, i: int = i) -> None:
                self._wait_gather(units[i])
                if i + 1 < len(units):
                    self._gather(units[i + 1], async_op=True)

            def post_forward(_m: Any, _args: Any, out: Any, i: int = i) -> Any:
                self._free(units[i])
                if torch.is_grad_enabled() and isinstance(out, torch.Tensor) and out.requires_grad:
                    out.register_hook(lambda g, i=i: self._pre_backward(units, i, g))
                return out

            mod.register_forward_pre_hook(pre_forward)
            mod.register_forward_hook(post_forward)

    def _pre_backward(self, units: list[Bucket], i: int, g: torch.Tensor) -> torch.Tensor:
        self._wait_gather(units[i])
        if i + 1 < len(units):
            self._free(units[i + 1])  # its backward is done
        if i > 0:
            self._gather(units[i - 1], async_op=True)
        return g

    def before_backward(self, chunk: int) -> None:
        """The pipeline runtime, before a backward walk of `chunk`: gather the unit it starts at."""
        if self.zero == 3 and self.chunks[chunk].units:
            units = self.chunks[chunk].units
            self._wait_gather(units[-1])
            if len(units) > 1:
                self._gather(units[-2], async_op=True)

    def after_backward(self, chunk: int) -> None:
        """After a backward walk of `chunk`: every gathered unit of it is freed."""
        if self.zero == 3:
            for b in self.chunks[chunk].units:
                self._free(b)

    # ---- gradients ---------------------------------------------------------------------------
    def _grad_hook(self, b: Bucket, p: nn.Parameter) -> Any:
        c_off = None

        def hook(param: torch.Tensor) -> None:
            nonlocal c_off
            g = param.grad
            if g is None:
                return
            if b.work is not None:  # the previous micro-batch's reduction of this bucket
                self._complete(b)
            if b.gbuf is None:
                b.gbuf = torch.zeros(b.numel, dtype=torch.float32, device=g.device)
                self.ledger.add("staging", b.gbuf.numel() * 4)
            if c_off is None:
                c_off = self.chunks[b.chunk].offsets[id(p)] - b.start
            b.gbuf[c_off:c_off + g.numel()].add_(g.reshape(-1).float())
            param.grad = None
            b.pending -= 1
            if b.pending == 0 and not b.deferred:
                b.pending = len(b.params)
                if self.zero >= 2 or self.sync[b.chunk]:
                    self._launch(b)

        return hook

    def _launch(self, b: Bucket) -> None:
        assert b.gbuf is not None
        for p in b.params:  # sequence-parallel replicas: sum the partial gradients over TP first
            if getattr(p, "sequence_parallel", False) and self.groups.tp.size > 1:
                o = self.chunks[b.chunk].offsets[id(p)] - b.start
                comm.all_reduce(b.gbuf[o:o + p.numel()], self.groups.tp)
        b.scratch = torch.empty(b.numel // self.d, dtype=torch.float32, device=b.gbuf.device)
        _, b.work = comm.reduce_scatter(b.gbuf, self.dp, async_op=True, out=b.scratch)

    def _complete(self, b: Bucket) -> None:
        """Wait for the bucket's reduce-scatter; its owned slice goes where the optimizer reads it."""
        if b.work is None:
            return
        b.work.wait()
        b.work = None
        c = self.chunks[b.chunk]
        if self.zero == 1:
            n = b.numel // self.d
            b.gbuf[self.k * n:(self.k + 1) * n].copy_(b.scratch)  # type: ignore[index]
        else:
            lo, hi = self._slice(b)
            c.gshard[lo:hi].add_(b.scratch)  # type: ignore[index]
            self.ledger.add("staging", -b.gbuf.numel() * 4)  # type: ignore[union-attr]
            b.gbuf = None
        b.scratch = None

    def set_sync(self, chunk: int, enabled: bool) -> None:
        self.sync[chunk] = enabled

    def start_step(self) -> None:
        for c in self.chunks:
            if c.gshard is not None:
                c.gshard.zero_()
            for b in c.buckets:
                b.pending, b.work = len(b.params), None
                if self.zero == 1:
                    b.gbuf.zero_()  # type: ignore[union-attr]
        self.sync = [False] * len(self.chunks)

    def finish(self) -> None:
        """After the last backward: reduce the deferred (tied) buckets, wait for every reduction."""
        if self.tied_pair:  # both copies here, a deferred bucket each of the same size: summed on this rank
            sum_tied(*(b.gbuf for c in self.chunks for b in c.buckets if b.deferred))  # type: ignore[arg-type]
        for c in self.chunks:
            for b in c.buckets:
                if b.deferred and b.gbuf is not None:
                    comm.all_reduce(b.gbuf, self.groups.embed)  # (a V's embedding group is this rank: nothing)
                    self._launch(b)
                elif b.work is None and b.gbuf is not None:
                    self._launch(b)  # stage 1 outside the hooks, or gradients that never all arrived
        for c in self.chunks:
            for b in c.buckets:
                self._complete(b)
                b.pending = len(b.params)
            if self.zero == 3:
                for b in c.units:
                    self._free(b)

    # ---- optimizer ---------------------------------------------------------------------------
    def grad_norm(self) -> float:
        sq = torch.zeros(1, dtype=torch.float64, device=self.chunks[0].decay.device)
        for c in self.chunks:
            for b in c.buckets:
                lo, hi = self._slice(b)
                g = self._grad_of(c, b) * c.norm[lo:hi]
                sq += torch.linalg.vector_norm(g).double() ** 2
        comm.all_reduce(sq, self.groups.tp)
        comm.all_reduce(sq, self.groups.pp)
        comm.all_reduce(sq, self.dp)
        return float(sq.sqrt())

    def lr_at(self, step: int) -> float:
        return lr_schedule(self.train, step)

    def step(self, step: int) -> dict[str, Any]:
        t = self.train
        norm = self.grad_norm()
        lr = self.lr_at(step)
        if not math.isfinite(norm):
            return {"grad_norm": norm, "lr": lr, "skipped": True}
        self.step_count += 1
        k = self.step_count
        coef, bc1, bc2 = adam_terms(t, norm, k)
        for c in self.chunks:
            for b in c.buckets:
                lo, hi = self._slice(b)
                w, g = self._master_of(c, b), self._grad_of(c, b)
                m, v = c.exp_avg[lo:hi], c.exp_avg_sq[lo:hi]
                w.mul_(c.decay[lo:hi] * -(lr * t.weight_decay) + 1.0)
                if _FUSED_ADAM:
                    torch._fused_adamw_([w], [g], [m], [v], [], [torch.tensor(float(k), device=w.device)],
                                        lr=lr, beta1=t.beta1, beta2=t.beta2, weight_decay=0.0, eps=t.eps,
                                        amsgrad=False, maximize=False,
                                        grad_scale=torch.tensor(1.0 / coef, device=w.device) if coef != 1.0 else None,
                                        found_inf=None)
                else:
                    gs = g * coef
                    m.mul_(t.beta1).add_(gs, alpha=1 - t.beta1)
                    v.mul_(t.beta2).addcmul_(gs, gs, value=1 - t.beta2)
                    w.addcdiv_(m, (v / bc2).sqrt_().add_(t.eps), value=-lr / bc1)
            self._publish(c)
        return {"grad_norm": norm, "lr": lr, "skipped": False}

    def _publish(self, c: Chunk) -> None:
        """The updated owned slices reach the weights the next forward uses."""
        if self.zero == 3 and not self.fp32:
            c.lowp_shard.copy_(c.master)  # type: ignore[union-attr]
        for b in c.buckets:
            if not b.resident:
                continue  # gathered from the shards before its next use
            own = self._master_of(c, b).to(self.lowp).clone()
            comm.all_gather_into(b.full, own, self.dp)  # type: ignore[arg-type]

    # ---- checkpoints and inspection: full (unsharded over DP) flat tensors ------------------
    def full_flat(self, kind: str, ci: int) -> torch.Tensor:
        """The chunk's `kind` ("model", "exp_avg", "exp_avg_sq", "grad") in the unsharded flat layout
        of `offsets` (fp32): the owned slices gathered over the group.  Collective."""
        c = self.chunks[ci]
        out = torch.zeros(c.total, dtype=torch.float32, device=c.decay.device)
        for b in c.buckets:
            lo, hi = self._slice(b)
            if kind == "model":
                part = self._master_of(c, b)
            elif kind == "grad":
                part = self._grad_of(c, b)
            else:
                part = (c.exp_avg if kind == "exp_avg" else c.exp_avg_sq)[lo:hi]
            comm.all_gather_into(out[b.start:b.start + b.numel], part.float().contiguous(), self.dp)
        return out

    def flat_numel(self, ci: int) -> int:
        return self.chunks[ci].total

    def load_flat(self, kind: str, ci: int, full: torch.Tensor) -> None:
        """Set the chunk's `kind` from a full flat tensor (each rank keeps its slices)."""
        c = self.chunks[ci]
        with torch.no_grad():
            for b in c.buckets:
                lo, hi = self._slice(b)
                n = b.numel // self.d
                mine = full[b.start + self.k * n:b.start + (self.k + 1) * n]
                if kind == "exp_avg":
                    c.exp_avg[lo:hi].copy_(mine)
                elif kind == "exp_avg_sq":
                    c.exp_avg_sq[lo:hi].copy_(mine)
                elif kind == "model":
                    if b.resident:
                        b.full.copy_(full[b.start:b.start + b.numel].to(self.lowp))  # type: ignore[union-attr]
                    if not (self.fp32 and b.resident):
                        c.master[lo:hi].copy_(mine)
            if kind == "model" and self.zero == 3 and not self.fp32:
                c.lowp_shard.copy_(c.master)  # type: ignore[union-attr]

    def finite(self) -> bool:
        ts = [t for c in self.chunks for t in (c.master, c.exp_avg, c.exp_avg_sq)]
        ts += [b.full for c in self.chunks for b in c.buckets if b.resident]  # type: ignore[misc]
        return all(bool(torch.isfinite(t).all()) for t in ts)

    def gathered(self) -> Any:
        """Context: every stage-3 unit gathered (to read full parameters), freed after."""
        return _AllGathered(self)

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds: weights, gradients, optimizer state (persistent), and the peaks
        of the transient buffers."""
        weights = sum(b.full.numel() * b.full.element_size() for c in self.chunks  # type: ignore[union-attr]
                      for b in c.buckets if b.resident)
        opt = sum(c.exp_avg.numel() * 8 for c in self.chunks)
        if self.zero == 3 and self.fp32:
            weights += sum(c.master.numel() * 4 for c in self.chunks)
        else:
            opt += sum(c.master.numel() * 4 for c in self.chunks)
        if self.zero == 3 and not self.fp32:
            weights += sum(c.lowp_shard.numel() * c.lowp_shard.element_size() for c in self.chunks)  # type: ignore[union-attr]
        if self.zero == 1:
            grads = sum(b.gbuf.numel() * 4 for c in self.chunks for b in c.buckets)  # type: ignore[union-attr]
        else:
            grads = sum(c.gshard.numel() * 4 for c in self.chunks)  # type: ignore[union-attr]
        return {"weights": weights, "grads": grads, "optimizer": opt,
                "gathered_weights_peak": self.ledger.peak["gathered"],
                "grad_buckets_peak": self.ledger.peak["staging"]}


class _AllGathered:
    def __init__(self, dp: ShardedDataParallel):
        self.dp = dp

    def __enter__(self) -> None:
        for c in self.dp.chunks:
            for b in c.units:
                self.dp._wait_gather(b)

    def __exit__(self, *exc: Any) -> None:
        for c in self.dp.chunks:
            for b in c.units:
                self.dp._free(b)

