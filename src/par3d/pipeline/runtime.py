"""Execute this rank's list of pipeline actions with real modules and point-to-point transfers.

The list comes from `schedules.build` — the same list the checker proved and the simulator
timed — so the measured timeline this records (same `Event` format) can be laid next to the
predicted one.

What a stage computes is separate from how the list is walked: `ModelStage` runs the chunks
with autograd (saved-tensor hooks measure activation memory, on the first forward of each
chunk and input shape; the last stage's loss is summed),
`SyntheticStage` only waits (`--synthetic-stage-ms`, the seed's section 3.3 experiment), so
that experiment measures exactly this walk: receives, sends, events, counters.

Transfers: a send is posted (`isend`) as soon as its tensor exists and waited only at the end
of the step; a receive is posted a few actions ahead of the action that needs it.  Between CPU
ranks on one host they go through shared memory (`shm.py`: the sender copies into the
receiver's slot, the receiver reads it in place, seen within microseconds); otherwise, or with
`--p2p backend`, through the backend's isend/irecv as described next.  Because sends never
block, an order the checker accepts (no cycle of waits under blocking transfers) cannot
deadlock here.  Every message carries a tag naming (kind, stage, micro-batch), so the order in
which two ranks post messages to each other does not matter (gloo matches by tag).  NCCL
ignores tags, matches by order per communicator and runs a communicator's operations one after
another, a send waiting for its receive.  So every message travels on the group of its channel
(`schedules.p2p_channel`: activations, gradients, and each of them against its usual direction —
the interleaved wrap-around, the V's way back) and its pair of ranks: the pp group and three
twins at p = 2, a two-rank group per (channel, pair) beyond (`mesh.build_groups`' p2p_pairs,
built on NCCL and with --p2p backend), because torch puts all of a bigger group's sends and
receives on one communicator once the group is initialised eagerly.  `schedules.nccl_problems`
replays this posting order under NCCL's rules and proves (a test checks every schedule) that no
message meets the wrong receive and nothing hangs.

Zero-bubble actions split a backward for real (`par3d.weight_grad`): BI walks the graph once,
computing the input gradient and every gradient but the linear layers' weight GEMMs, for which
it keeps (W, x, dy); the graph is freed.  BW then runs only those GEMMs.  So BI + BW costs one B
(docs/pipeline.md has the measurement), and the previous stage gets its gradient a weight-GEMM
sooner.

Placement: which pipeline rank holds each stage comes with the schedule (round-robin, or the V of
ZB-V / DualPipe-V, where the last stage is on rank 0 with the first).  Two consecutive stages on
one rank (the V's turn) hand their tensor over in memory: no message.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from par3d import comm, timing, weight_grad
from par3d.mesh import Groups
from par3d.pipeline import shm
from par3d.pipeline.schedules import P2P_LOOKAHEAD, Action, p2p_channel, stage_rank
from par3d.pipeline.simulate import Event

_KIND_CODE = {"act": 0, "grad": 1}


def _tag(what: str, stage: int, mb: int, m: int) -> int:
    return (_KIND_CODE[what] * 4096 + stage) * max(m, 1) + mb


@dataclass
class _Slot:
    """What a forward leaves for its backward."""

    inp: torch.Tensor | None
    out: torch.Tensor | None  # activation (to send) or the scaled loss (last stage); None after BI
    deferred: list = field(default_factory=list)  # BI's (W, x, dy) for BW (weight_grad)
    saved_bytes: int = 0


class ActivationMeter:
    """Counts the bytes autograd saves for backward, per (stage, micro-batch), with
    saved-tensor hooks; parameters (saved by every linear layer) are not activations."""

    def __init__(self, params: list[nn.Parameter]):
        # storages are known by their StorageImpl, not their address: ZeRO-3 frees a parameter's
        # storage (resize to 0) and re-allocates it when the parameter is gathered again
        self.param_storages = {p.untyped_storage()._cdata for p in params}
        self.current: set[int] = set()
        self.current_bytes = 0
        self.live = 0
        self.peak = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
        except (RuntimeError, NotImplementedError):
            return t
        if storage._cdata not in self.param_storages and ptr not in self.current:
            self.current.add(ptr)
            self.current_bytes += t.untyped_storage().nbytes()
        return t

    def begin(self) -> None:
        self.current, self.current_bytes = set(), 0

    def end(self) -> int:
        """The bytes saved since `begin`, now live."""
        self.add(self.current_bytes)
        return self.current_bytes

    def add(self, n: int) -> None:
        self.live += n
        self.peak = max(self.peak, self.live)

    def free(self, n: int) -> None:
        self.live -= n


def _held_bytes(deferred: list) -> int:
    """The bytes a BI's deferred weight GEMMs keep alive: each distinct storage of their inputs and output gradients."""
    seen: dict[int, int] = {}
    for _w, x, dy in deferred:
        for t in (x, dy):
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


@dataclass
class StepResult:
    loss_sum: float  # sum over this rank's micro-batches of the scaled loss (last stage only)
    events: list[Event] = field(default_factory=list)
    peak_activation_bytes: int = 0
    activation_bytes_per_microbatch: int = 0  # the largest single forward's saved bytes


class ModelStage:
    """Runs this rank's model chunks: forwards (with saved-tensor hooks measuring activation
    memory the first time, see `saved_bytes`), the loss on the last stage, backwards (whole, or split into BI and BW for zero-bubble)."""

    def __init__(self, chunks: list[nn.Module], p: int, n_stages: int, chunk_of: dict[int, int]):
        self.chunks, self.p, self.last = chunks, p, n_stages - 1
        self.chunk_of = chunk_of  # this rank's stage -> index into chunks
        self.meter = ActivationMeter([q for c in chunks for q in c.parameters()])
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.meter.pack, lambda t: t)
        # bytes a forward saves, by what decides them: the chunk, its input's and targets' shapes
        # and dtype, grad mode, train mode.  Counted (hooks on) the first time a key is seen, then
        # reused: the hooks cost 2-4 % of a forward + backward (one Python call per saved tensor,
        # ~100 per 4-block stage; benchmarks/README.md, "Reading the rows"), and nothing these
        # chunks save depends on the data (no data-dependent shapes), so the count cannot change.
        self.saved_bytes: dict[tuple[Any, ...], int] = {}

    def begin_step(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]], loss_scale: float) -> None:
        self.microbatches, self.loss_scale = microbatches, loss_scale
        self.slots: dict[tuple[int, int], _Slot] = {}
        self.losses: list[torch.Tensor] = []
        self.meter.live = self.meter.peak = 0
        self.per_mb = 0

    def end_step(self) -> tuple[float, int, int]:
        """(loss sum over this rank's micro-batches, peak activation bytes, largest per micro-batch)."""
        loss = float(torch.stack(self.losses).double().sum()) if self.losses else 0.0
        return loss, self.meter.peak, self.per_mb

    def forward(self, a: Action, received: torch.Tensor | None) -> torch.Tensor | None:
        """The activation to send on (None on the last stage)."""
        x, targets = self.microbatches[a.microbatch]
        # a received activation is the transport's buffer: a fresh tensor of it becomes the leaf
        inp = None if received is None else received.detach().requires_grad_(True)
        chunk, src = self.chunks[self.chunk_of[a.stage]], (x if inp is None else inp)
        tgt = targets if a.stage == self.last else None
        key = (a.stage, src.shape, src.dtype, None if tgt is None else tgt.shape, torch.is_grad_enabled(),
               chunk.training)
        saved = self.saved_bytes.get(key)
        if saved is None:
            self.meter.begin()
            with self.hooks:
                out = chunk(src, tgt)
            saved = self.saved_bytes[key] = self.meter.end()
        else:
            out = chunk(src, tgt)
            self.meter.add(saved)
        self.per_mb = max(self.per_mb, saved)
        if a.stage == self.last:
            out = out.sum() * self.loss_scale
            self.losses.append(out.detach())
        self.slots[(a.stage, a.microbatch)] = _Slot(inp, out, saved_bytes=saved)
        return None if a.stage == self.last else out

    def backward(self, a: Action, grad_out: torch.Tensor | None) -> torch.Tensor | None:
        """B: every gradient; BI: all but the linear weights' (kept for BW, graph freed); BW: the
        weight GEMMs.  Returns the input gradient to send back (None on the first stage and for BW)."""
        key = (a.stage, a.microbatch)
        slot = self.slots[key]
        if a.kind == "BW":
            weight_grad.apply(slot.deferred)
            self.meter.free(slot.saved_bytes)
            del self.slots[key]
            return None
        out, slot.out = slot.out, None
        assert out is not None, f"{a}: no forward output (a second backward?)"
        if a.kind == "BI":
            with weight_grad.deferring(slot.deferred):
                self._autograd(out, grad_out)
            # the graph is freed: what stays alive until BW is each linear layer's (x, dy), no longer the forward's
            # saved tensors (the share zb-v's memory cap counts, memory.weight_grad_share)
            kept = _held_bytes(slot.deferred)
            self.meter.free(slot.saved_bytes)
            self.meter.add(kept)
            slot.saved_bytes = kept
        else:
            self._autograd(out, grad_out)
            self.meter.free(slot.saved_bytes)
            del self.slots[key]
        inp, slot.inp = slot.inp, None
        if inp is None:  # the first stage: nothing to send back
            return None
        return inp.grad if inp.grad is not None else torch.zeros_like(inp)

    @staticmethod
    def _autograd(out: torch.Tensor, grad_out: torch.Tensor | None) -> None:
        if grad_out is None:
            torch.autograd.backward(out)
        else:
            torch.autograd.backward(out, grad_tensors=grad_out)


class SyntheticStage:
    """The seed's section 3.3 experiment: a stage "computes" by waiting t_f / t_b (zero-bubble
    splits t_b in halves) and sends a fixed tensor on; the transfers are real."""

    def __init__(self, ms: tuple[float, float], act_shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device, n_stages: int, zero_bubble: bool):
        self.tf, self.tb = ms[0] / 1e3, ms[1] / 1e3 / (2 if zero_bubble else 1)
        self.last = n_stages - 1
        self.act = torch.zeros(act_shape, dtype=dtype, device=device)  # never written: safe to send often

    def begin_step(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]], loss_scale: float) -> None:
        pass

    def end_step(self) -> tuple[float, int, int]:
        return 0.0, 0, 0

    def forward(self, a: Action, received: torch.Tensor | None) -> torch.Tensor | None:
        _wait(self.tf)
        return None if a.stage == self.last else self.act

    def backward(self, a: Action, grad_out: torch.Tensor | None) -> torch.Tensor | None:
        if a.kind == "BI" and a.stage == 0:
            return None  # the first stage has no input gradient to compute (as ModelStage)
        _wait(self.tb)
        return None if (a.kind == "BW" or a.stage == 0) else self.act


class PipelineRuntime:
    def __init__(self, chunks: list[nn.Module], actions: list[Action], groups: Groups, p: int, m: int,
                 v: int, act_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 set_sync: Callable[[int, bool], None] | None = None,
                 synthetic_ms: tuple[float, float] | None = None, p2p: str = "auto",
                 timeout_s: float = 60.0, placement: dict[int, int] | None = None,
                 around_backward: Any = None):
        """`placement`: stage -> pipeline rank of the whole schedule (`schedules.placement`);
        default round-robin."""
        self.actions, self.groups = actions, groups
        self.p, self.m, self.v = p, m, v
        self.n_stages = p * v
        self.rank_of = placement or {s: stage_rank(s, p) for s in range(self.n_stages)}
        # a stage's chunk index on the rank that holds it: its rank's stages in increasing order
        held: dict[int, list[int]] = {}
        for s_, r_ in sorted(self.rank_of.items()):
            held.setdefault(r_, []).append(s_)
        self.chunk_index = {s_: held[r_].index(s_) for s_, r_ in self.rank_of.items()}
        self.act_shape, self.dtype, self.device = act_shape, dtype, device
        self.set_sync = set_sync
        # ZeRO-3 gathers a chunk's last unit before a backward walk and frees its units after
        # (an object with before_backward(chunk) / after_backward(chunk); None: nothing to do)
        self.around_backward = around_backward
        self.synthetic_ms = synthetic_ms
        zero_bubble = any(a.kind in ("BI", "BW") for a in actions)
        self.split_backward = zero_bubble and synthetic_ms is None
        self.stage: ModelStage | SyntheticStage = (
            ModelStage(chunks, p, self.n_stages, self.chunk_index) if synthetic_ms is None else
            SyntheticStage(synthetic_ms, act_shape, dtype, device, self.n_stages, zero_bubble))
        self.pp_rank = groups.coord.pp
        # the last backward (B or BW) of each chunk in this step: its gradients are final then
        self.last_backward: dict[int, int] = {}
        for idx, a in enumerate(actions):
            if a.kind in ("B", "BW"):
                self.last_backward[self.chunk_index[a.stage]] = idx
        self._recv_keys = [self._recv_key(a) for a in actions]
        self.lookahead = P2P_LOOKAHEAD  # receives posted ahead of the action that needs them
        self._shm = self._shared_memory(p2p, timeout_s) if p > 1 else None
        self.transport = "shm" if self._shm is not None else ("backend" if p > 1 else "none")

    def _shared_memory(self, mode: str, timeout_s: float) -> shm.ShmTransport | None:
        """The shared-memory transport when `mode` allows it and every rank of the pipeline group
        can use it (a collective over the group: all its ranks build their runtimes together)."""
        if mode == "backend":
            return None
        token = shm.agree(self.groups.pp, self.device, mode)
        if token is None:
            return None
        # the channels (what, peer pipeline rank) this rank receives on, as run_step will, and sends
        # on: F sends an activation unless last, B/BI a gradient unless first; none between two
        # stages of this rank
        receives = {(key[0], self.rank_of[key[1]]) for key in self._recv_keys
                    if key is not None and not self._local(key[1])}
        sends = {("act", self.rank_of[a.stage + 1]) if a.kind == "F" else ("grad", self.rank_of[a.stage - 1])
                 for a in self.actions
                 if (a.kind == "F" and a.stage < self.n_stages - 1) or (a.kind in ("B", "BI") and a.stage > 0)}
        sends = {ch for ch in sends if ch[1] != self.pp_rank}
        # synthetic stages only wait: their ranks need no core while polling
        spin_s, handoff = shm.waiting_policy(ranks_compute=self.synthetic_ms is None)
        t = shm.ShmTransport(self.groups.pp, self.pp_rank, self.p, self.v, self.m, self.act_shape,
                             self.dtype, token, timeout_s, receives, sends, spin_s=spin_s, handoff=handoff,
                             chunk_of=self.chunk_index.__getitem__)
        if not t.ok:
            if mode == "shm":
                raise RuntimeError(f"parallel.p2p='shm': could not reserve shared memory in {shm._DIR} "
                                   "(too small?); use --p2p auto or --p2p backend")
            return None
        return t

    # ---- transfers -----------------------------------------------------------------------------
    def _peer(self, stage: int) -> int:
        return self.groups.mesh.pp_rank_to_global(self.groups.global_rank, self.rank_of[stage])

    def _local(self, stage: int) -> bool:
        """`stage` is on this rank too: its tensor is handed over in memory (the V's turn)."""
        return self.rank_of[stage] == self.pp_rank

    def _recv_key(self, a: Action) -> tuple[str, int, int, int] | None:
        """(what, from_stage, tag_stage, microbatch) of the tensor action `a` waits for, if any."""
        if a.kind == "F" and a.stage > 0:
            return ("act", a.stage - 1, a.stage, a.microbatch)
        if a.kind in ("B", "BI") and a.stage != self.n_stages - 1:
            return ("grad", a.stage + 1, a.stage, a.microbatch)
        return None

    def _post_recvs(self, upto: int) -> None:
        """Post the receives of the next actions early, so a transfer that lands while this rank
        computes is already here when needed (a receive never blocks until waited on).  Shared
        memory needs no posting: a message lands in its slot whenever it is sent."""
        while self._posted_upto < min(upto, len(self.actions)):
            key = self._recv_keys[self._posted_upto]
            self._posted_upto += 1
            if key is None or self._local(key[1]):
                continue
            what, from_stage, tag_stage, mb = key
            t = torch.empty(self.act_shape, dtype=self.dtype, device=self.device)
            channel = self._channel(what, self.rank_of[from_stage], self.pp_rank)
            work = comm.irecv(t, self._peer(from_stage), channel, _tag(what, tag_stage, mb, self.m))
            self._inbox[key] = (t, work)

    def _recv(self, key: tuple[str, int, int, int]) -> torch.Tensor:
        what, from_stage, tag_stage, mb = key
        if self._local(from_stage):
            return self._handed.pop((what, tag_stage, mb))
        if self._shm is not None:
            return self._shm.recv(what, tag_stage, mb, self.rank_of[from_stage])
        t, work = self._inbox.pop(key)
        work.wait()
        return t

    def _send(self, what: str, t: torch.Tensor, to_stage: int, stage_tag: int, mb: int) -> None:
        if self._local(to_stage):
            self._handed[(what, stage_tag, mb)] = t.detach()  # same rank: no copy, no message
            return
        if self._shm is not None:
            self._shm.send(t, what, stage_tag, mb, self.rank_of[to_stage])  # copies the bytes, never records autograd
            return
        channel = self._channel(what, self.pp_rank, self.rank_of[to_stage])
        self._pending.append(comm.isend(t.detach().contiguous(), self._peer(to_stage), channel,
                                        _tag(what, stage_tag, mb, self.m)))

    def _channel(self, what: str, src: int, dst: int) -> Any:
        """The group of a message from pipeline rank `src` to `dst`: activations and gradients on
        twins of the pp group, and each of them against its usual direction (the interleaved
        wrap-around, the V's way back) on two more, so that every communicator carries one
        direction between two ranks (schedules.p2p_channel; schedules.nccl_problems replays this
        under NCCL's rules for every schedule).  Groups built by hand without twins use pp."""
        g = self.groups
        ch = p2p_channel(what, src, dst)
        pair = g.p2p.get((ch, min(src, dst), max(src, dst)))
        if pair is not None:  # a group of the two ranks alone (mesh.build_groups' p2p_pairs)
            return pair
        grad = g.pp_grad or g.pp
        return {"act": g.pp, "grad": grad, "act_wrap": g.pp_wrap or g.pp, "grad_wrap": g.pp_grad_wrap or grad}[ch]

    # ---- one step ------------------------------------------------------------------------------
    def run_step(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]], loss_scale: float,
                 record: bool = True) -> StepResult:
        """Walk this rank's actions once.  Python's automatic garbage collection is paused for the
        walk and resumes after it: a collection pauses one rank at a moment of its own, and a
        paused stage stalls every stage downstream of it (Megatron-LM's manual GC, same reason)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._walk(microbatches, loss_scale, record)
        finally:
            if collecting:
                gc.enable()

    def _walk(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]], loss_scale: float,
              record: bool) -> StepResult:
        # linear layers use the deferrable op for the whole walk when BI/BW split backwards
        with weight_grad.splittable(self.split_backward):
            return self._walk_actions(microbatches, loss_scale, record)

    def _walk_actions(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]], loss_scale: float,
                      record: bool) -> StepResult:
        self._pending: list[Any] = []
        self._inbox: dict[tuple[str, int, int, int], tuple[torch.Tensor, Any]] = {}
        self._handed: dict[tuple[str, int, int], torch.Tensor] = {}  # between two stages of this rank
        self._posted_upto = 0
        times: list[tuple[Any, Any]] = []  # (start, end) marks of each action; Events made after the step
        clock = timing.Marks(self.device)  # CUDA events on a GPU: the device's times, not the launches
        clock.start()
        stage = self.stage
        stage.begin_step(microbatches, loss_scale)
        for idx, a in enumerate(self.actions):
            if self._shm is None:
                self._post_recvs(idx + 1 + self.lookahead)
            key = self._recv_keys[idx]
            received = self._recv(key) if key is not None else None
            t0 = clock.mark()  # busy time starts when the input has arrived
            if a.kind == "F":
                out = stage.forward(a, received)
                if out is not None:
                    self._send("act", out, a.stage + 1, a.stage + 1, a.microbatch)
            else:
                if self.set_sync is not None and self.last_backward.get(self.chunk_index[a.stage]) == idx:
                    self.set_sync(self.chunk_index[a.stage], True)
                if self.around_backward is not None:
                    self.around_backward.before_backward(self.chunk_index[a.stage])
                grad_in = stage.backward(a, received)
                if self.around_backward is not None:
                    self.around_backward.after_backward(self.chunk_index[a.stage])
                if grad_in is not None:
                    self._send("grad", grad_in, a.stage - 1, a.stage - 1, a.microbatch)
            if record:
                times.append((t0, clock.mark()))
        for w in self._pending:
            w.wait()
        self._pending = []
        if self._shm is not None:
            self._shm.flush_counts()
        loss_sum, peak, per_mb = stage.end_step()
        flat = clock.times([t for pair in times for t in pair])
        events = [Event(self.pp_rank, a.kind, a.stage, a.microbatch, flat[2 * k], flat[2 * k + 1])
                  for k, a in enumerate(self.actions[:len(times)])]
        return StepResult(loss_sum, events, peak, per_mb)


def _wait(seconds: float) -> None:
    """Wait `seconds` precisely without burning a core: sleep, then yield for the last 0.15 ms
    (a plain sleep overshoots by 10-80 us, which over a 2 ms synthetic stage is up to 4%)."""
    deadline = time.perf_counter() + seconds
    if seconds > 2e-4:
        time.sleep(seconds - 1.5e-4)
    while time.perf_counter() < deadline:
        os.sched_yield()
