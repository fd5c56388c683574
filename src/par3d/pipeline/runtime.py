"""Execute this rank's list of pipeline actions with real modules and point-to-point transfers.

The list comes from `schedules.build` — the same list the checker proved and the simulator
timed — so the measured timeline this records (same `Event` format) can be laid next to the
predicted one.

Transfers: a send is posted (`isend`) as soon as its tensor exists and waited only at the end
of the step; a receive is posted when the action that needs it starts.  Between CPU ranks on one
host they go through shared memory (`shm.py`: one slot per message, seen within microseconds);
otherwise, or with `--p2p backend`, through the backend's isend/irecv as described next.  Because sends never
block, an order the checker accepts (no cycle of waits under blocking transfers) cannot
deadlock here.  Every message carries a tag naming (kind, stage, micro-batch), so the order in
which two ranks post messages to each other does not matter (gloo matches by tag).  NCCL
ignores tags and matches by order per communicator: activations and gradients therefore use
two communicators, and `schedules.p2p_order_problems` proves (and a test checks, for every
schedule) that on each of them the receiver needs messages in the order the sender sends them.

Zero-bubble actions: BI computes only the input gradient (autograd restricted to the stage's
input, graph retained) so the previous stage can go on; BW later computes the weight gradients.
In eager PyTorch BW re-walks the retained graph, so BI + BW costs more than one B here — the
schedule's order is kept, its saving is not fully realised (documented in docs/pipeline.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from par3d import comm
from par3d.mesh import Groups
from par3d.pipeline import shm
from par3d.pipeline.schedules import Action, stage_chunk, stage_rank
from par3d.pipeline.simulate import Event

_KIND_CODE = {"act": 0, "grad": 1}


def _tag(what: str, stage: int, mb: int, m: int) -> int:
    return (_KIND_CODE[what] * 4096 + stage) * max(m, 1) + mb


@dataclass
class _Slot:
    """What a forward leaves for its backward."""

    inp: torch.Tensor | None
    out: torch.Tensor  # activation (to send) or the scaled loss (last stage)
    grad_out: torch.Tensor | None = None
    saved_bytes: int = 0


class ActivationMeter:
    """Counts the bytes autograd saves for backward, per (stage, micro-batch), with
    saved-tensor hooks; parameters (saved by every linear layer) are not activations."""

    def __init__(self, params: list[nn.Parameter]):
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        self.current: set[int] = set()
        self.current_bytes = 0
        self.live = 0
        self.peak = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            ptr = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):
            return t
        if ptr not in self.param_ptrs and ptr not in self.current:
            self.current.add(ptr)
            self.current_bytes += t.untyped_storage().nbytes()
        return t

    def begin(self) -> None:
        self.current, self.current_bytes = set(), 0

    def end(self) -> int:
        n = self.current_bytes
        self.live += n
        self.peak = max(self.peak, self.live)
        return n

    def free(self, n: int) -> None:
        self.live -= n


@dataclass
class StepResult:
    loss_sum: float  # sum over this rank's micro-batches of the scaled loss (last stage only)
    events: list[Event] = field(default_factory=list)
    peak_activation_bytes: int = 0
    activation_bytes_per_microbatch: int = 0  # the largest single forward's saved bytes


class PipelineRuntime:
    def __init__(self, chunks: list[nn.Module], actions: list[Action], groups: Groups, p: int, m: int,
                 v: int, act_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 set_sync: Callable[[int, bool], None] | None = None,
                 synthetic_ms: tuple[float, float] | None = None, p2p: str = "auto",
                 timeout_s: float = 60.0):
        self.chunks, self.actions, self.groups = chunks, actions, groups
        self.p, self.m, self.v = p, m, v
        self.n_stages = p * v
        self.act_shape, self.dtype, self.device = act_shape, dtype, device
        self.set_sync = set_sync
        self.synthetic_ms = synthetic_ms
        if synthetic_ms is not None:  # allocated once: a synthetic stage only waits
            self._syn_act = torch.zeros(act_shape, dtype=dtype, device=device)
            self._syn_loss = torch.zeros((), dtype=torch.float64, device=device)
        self.pp_rank = groups.coord.pp
        # the last backward (B or BW) of each chunk in this step: its gradients are final then
        self.last_backward: dict[int, int] = {}
        for idx, a in enumerate(actions):
            if a.kind in ("B", "BW"):
                self.last_backward[stage_chunk(a.stage, p)] = idx
        self.lookahead = 2  # receives posted ahead of the action that needs them
        self._zb = any(a.kind in ("BI", "BW") for a in actions)
        self.meter = ActivationMeter([q for c in chunks for q in c.parameters()])
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
        # the channels this rank receives on (as run_step will) and sends on (F sends an activation
        # unless last, B/BI a gradient unless first)
        receives = {key[0] for a in self.actions if (key := self._recv_key(a)) is not None}
        sends = {"act" if a.kind == "F" else "grad" for a in self.actions
                 if (a.kind == "F" and a.stage < self.n_stages - 1) or (a.kind in ("B", "BI") and a.stage > 0)}
        t = shm.ShmTransport(self.groups.pp, self.pp_rank, self.p, self.v, self.m, self.act_shape,
                             self.dtype, token, timeout_s, receives, sends,
                             # synthetic stages only wait: their ranks need no core while polling
                             spin_s=shm.spin_budget(busy_ranks_need_cores=self.synthetic_ms is None))
        if not t.ok:
            if mode == "shm":
                raise RuntimeError(f"parallel.p2p='shm': could not reserve shared memory in {shm._DIR} "
                                   "(too small?); use --p2p auto or --p2p backend")
            return None
        return t

    # ---- transfers -----------------------------------------------------------------------------
    def _peer(self, stage: int) -> int:
        return self.groups.mesh.pp_rank_to_global(self.groups.global_rank, stage_rank(stage, self.p))

    def _recv_key(self, a: Action) -> tuple[str, int, int, int] | None:
        """(what, from_stage, tag_stage, microbatch) of the tensor action `a` waits for, if any."""
        if a.kind == "F" and a.stage > 0:
            return ("act", a.stage - 1, a.stage, a.microbatch)
        if a.kind in ("B", "BI") and a.stage != self.n_stages - 1:
            return ("grad", a.stage + 1, a.stage, a.microbatch)
        return None

    def _post_recvs(self, upto: int) -> None:
        """Post the receives of the next actions early, so a transfer that lands while this rank
        computes is already here when needed (a receive never blocks until waited on)."""
        while self._posted_upto < min(upto, len(self.actions)):
            key = self._recv_key(self.actions[self._posted_upto])
            self._posted_upto += 1
            if key is None:
                continue
            what, from_stage, tag_stage, mb = key
            t = torch.empty(self.act_shape, dtype=self.dtype, device=self.device)
            if self._shm is not None:
                self._inbox[key] = (t, self._shm.irecv(t, what, tag_stage, mb))
                continue
            work = comm.irecv(t, self._peer(from_stage), self._channel(what), _tag(what, tag_stage, mb, self.m))
            self._inbox[key] = (t, work)

    def _recv(self, what: str, from_stage: int, stage_tag: int, mb: int) -> torch.Tensor:
        t, work = self._inbox.pop((what, from_stage, stage_tag, mb))
        work.wait()
        return t

    def _send(self, what: str, t: torch.Tensor, to_stage: int, stage_tag: int, mb: int) -> None:
        if self._shm is not None:
            self._shm.isend(t.detach(), what, stage_tag, mb)
            return
        self._pending.append(comm.isend(t.detach().contiguous(), self._peer(to_stage), self._channel(what),
                                        _tag(what, stage_tag, mb, self.m)))

    def _channel(self, what: str) -> Any:
        """Activations on the pp group, gradients on its twin (see schedules.p2p_order_problems)."""
        return self.groups.pp_grad if (what == "grad" and self.groups.pp_grad is not None) else self.groups.pp

    # ---- one step ------------------------------------------------------------------------------
    def run_step(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]], loss_scale: float,
                 record: bool = True) -> StepResult:
        self._pending: list[Any] = []
        self._inbox: dict[tuple[str, int, int, int], tuple[torch.Tensor, Any]] = {}
        self._posted_upto = 0
        slots: dict[tuple[int, int], _Slot] = {}
        events: list[Event] = []
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.meter.live = 0
        self.meter.peak = 0
        per_mb = 0
        last = self.n_stages - 1
        for idx, a in enumerate(self.actions):
            self._post_recvs(idx + 1 + self.lookahead)
            chunk = self.chunks[stage_chunk(a.stage, self.p)]
            t0 = time.time()
            if a.kind == "F":
                if a.stage == 0:
                    inp = None
                    x = microbatches[a.microbatch][0]
                else:
                    inp = self._recv("act", a.stage - 1, a.stage, a.microbatch).requires_grad_(True)
                    x = inp
                targets = microbatches[a.microbatch][1] if a.stage == last else None
                t0 = time.time()  # busy time starts when the input has arrived
                self.meter.begin()
                with torch.autograd.graph.saved_tensors_hooks(self.meter.pack, lambda t: t):
                    out = self._forward(chunk, x, targets)
                saved = self.meter.end()
                per_mb = max(per_mb, saved)
                if a.stage == last:
                    out = out.sum() * loss_scale if self.synthetic_ms is None else out
                    loss_sum += out.detach().double()
                else:
                    self._send("act", out, a.stage + 1, a.stage + 1, a.microbatch)
                slots[(a.stage, a.microbatch)] = _Slot(inp, out, saved_bytes=saved)
            else:
                key = (a.stage, a.microbatch)
                slot = slots[key]
                if a.kind in ("B", "BW") and self.last_backward.get(stage_chunk(a.stage, self.p)) == idx \
                        and self.set_sync is not None:
                    self.set_sync(stage_chunk(a.stage, self.p), True)
                if a.kind in ("B", "BI") and a.stage != last:
                    slot.grad_out = self._recv("grad", a.stage + 1, a.stage, a.microbatch)
                    t0 = time.time()
                if a.kind == "B":
                    self._backward(slot, inputs=None, retain=False)
                    self._send_input_grad(a, slot)
                    self.meter.free(slot.saved_bytes)
                    del slots[key]
                elif a.kind == "BI":
                    if slot.inp is not None:
                        self._backward(slot, inputs=[slot.inp], retain=True)
                        self._send_input_grad(a, slot)
                else:  # BW
                    params = [q for q in chunk.parameters() if q.requires_grad]
                    self._backward(slot, inputs=params, retain=False)
                    self.meter.free(slot.saved_bytes)
                    del slots[key]
            if record:
                events.append(Event(self.pp_rank, a.kind, a.stage, a.microbatch, t0, time.time()))
        for w in self._pending:
            w.wait()
        self._pending = []
        return StepResult(float(loss_sum), events, self.meter.peak, per_mb)

    def _forward(self, chunk: nn.Module, x: torch.Tensor, targets: torch.Tensor | None) -> torch.Tensor:
        if self.synthetic_ms is not None:
            # the seed's section 3.3 experiment: a stage "computes" by waiting; transfers are real
            _wait(self.synthetic_ms[0] / 1000.0)
            if targets is not None:
                return self._syn_loss
            return self._syn_act  # never written: safe to send many times

        return chunk(x, targets)

    def _backward(self, slot: _Slot, inputs: list[torch.Tensor] | None, retain: bool) -> None:
        if self.synthetic_ms is not None:
            _wait(self.synthetic_ms[1] / 1000.0 / (2 if self._zb else 1))
            if slot.inp is not None and slot.inp.grad is None:
                slot.inp.grad = self._syn_act
            return
        if slot.grad_out is None:
            torch.autograd.backward(slot.out, inputs=inputs, retain_graph=retain)
        else:
            torch.autograd.backward(slot.out, grad_tensors=slot.grad_out, inputs=inputs, retain_graph=retain)

    def _send_input_grad(self, a: Action, slot: _Slot) -> None:
        if a.stage > 0 and slot.inp is not None:
            g = slot.inp.grad if slot.inp.grad is not None else torch.zeros_like(slot.inp)
            self._send("grad", g, a.stage - 1, a.stage - 1, a.microbatch)


def _wait(seconds: float) -> None:
    """Wait `seconds` precisely without burning a core: sleep, then yield for the last 0.15 ms
    (a plain sleep overshoots by 10-80 us, which over a 2 ms synthetic stage is up to 4%)."""
    deadline = time.perf_counter() + seconds
    if seconds > 2e-4:
        time.sleep(seconds - 1.5e-4)
    while time.perf_counter() < deadline:
        os.sched_yield()
