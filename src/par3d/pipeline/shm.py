"""Pipeline transfers through shared memory, for neighbouring stages on one host (CPU tensors).

Why: on the CPU path gloo sends every activation through a loopback TCP socket, and the
receiving side wakes two threads (gloo's I/O loop, then the waiting rank).  On a small VM one
such hop costs ~0.2 ms — 10 % of a 2 ms stage, paid 2(p-1) times on the critical path of a
1F1B step (docs/measured.md §4).  NCCL does the same thing for GPUs on one node (its SHM and
P2P transports); this is the CPU counterpart, chosen by `parallel.p2p = "auto"` whenever every
rank of a pipeline group is on one x86-64 host with CPU tensors, and by nothing else.

Layout.  Each rank owns one segment per inbound channel — "act" from the rank of the previous
stage, "grad" from the rank of the next (on the V placement from both neighbours: one segment
per (what, sender), so every segment has one writer) — with two slots per (local chunk, micro-batch), used by
turns (message k of a channel's (chunk, micro-batch) goes to slot k mod 2).  Every message of a
step therefore has a place of its own, so a send never waits for a receive (the property the
schedule checker assumes of `isend`), and a received tensor is handed over in place, without a
copy: the sender reaches that slot again two steps later, after this rank has finished the step
that used it (a rank's next step needs this rank's gradients of the current one).  A slot is a
64-byte header (seq, ack) and the tensor's bytes.

Protocol.  Sender: check that the slot's previous message was taken (ack == its seq; it always
has been, by the argument above), copy the tensor in, then publish seq.  Receiver: poll seq,
write ack, use the slot's tensor.  x86-64 keeps a core's stores in order and its loads in order
(TSO), so a published seq implies the bytes are there; on other architectures this module is
never selected.

Waiting.  A receiver first polls, yielding its core between looks (a message due any moment is
seen within microseconds), then sleeps on the segment's doorbell, a futex whose word the sender
bumps after publishing, then wakes; the kernel compares the word as it puts the receiver to
sleep, so a ring between the receiver's last look and its sleep is never lost.  Receivers that
poll until their message comes (below) never sleep, and their senders do not ring (a system
call saved per message); every rank of a group decides this alike (same host, same run).

The policy (`waiting_policy`) depends on what the ranks do and whether they have a core each:
  * ranks that compute, a core each: poll for up to 2 ms (nobody else needs the core);
  * ranks that compute, the host's cores oversubscribed: poll only 50 us, a polling rank would
    take time from one that computes (MPI's "yield when idle" rule under oversubscription);
  * ranks that only wait (synthetic stages): poll until the message comes (waking from a sleep
    costs tens of microseconds on a VM, and a polling rank takes time from nobody), and on an
    oversubscribed host a sender also yields its core right after publishing, so a receiver
    polling on the same core takes the message at once rather than after the sender's
    bookkeeping (measured on a 2-core VM with 4 ranks: the median time to notice a message fell
    from ~25 us to ~5 us).  Not done when ranks compute: the yield could hand the core to a
    computing rank for a whole time slice.
A peer that never sends is an error after the run's timeout, naming the peer and the message.
"""

from __future__ import annotations

import ctypes
import glob
import math
import mmap
import os
import platform
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from par3d import comm
from par3d.mesh import Group

_HEADER = 64  # bytes: seq (int64), ack (int64), padding to a cache line
_BELL = 64  # bytes before the first slot: the segment's doorbell (int32), its own cache line
_DIR = "/dev/shm"
_SYS_FUTEX = 202  # x86-64 (the only architecture this module is used on)
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared (not PRIVATE) futexes: the word is in shared memory
_memmove = ctypes.memmove
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_wait(addr: int, expected: int, timeout_s: float) -> None:
    """Sleep until the int32 at `addr` is woken, unless it no longer holds `expected` (checked by
    the kernel atomically with going to sleep: a wake-up between our look and the call is never
    lost), or `timeout_s` passes."""
    ts = _Timespec(int(timeout_s), int((timeout_s % 1) * 1e9))
    _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAIT, ctypes.c_int(expected), ctypes.byref(ts),
                  None, 0)


def _futex_wake(addr: int) -> None:
    _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(addr), _FUTEX_WAKE, ctypes.c_int(2**31 - 1), None, None, 0)


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


class _Segment:
    """One mmap'd file of `n_slots` slots, each a header and one tensor of `shape`: int64 header
    words through `words`, the tensors through `views` (made once: a transfer is one copy)."""

    def __init__(self, path: str, n_slots: int, shape: tuple[int, ...], dtype: torch.dtype, create: bool):
        numel = math.prod(shape)
        self.slot_bytes = _HEADER + _round_up(numel * dtype.itemsize, 64)
        size = _BELL + n_slots * self.slot_bytes
        fd = os.open(path, (os.O_RDWR | os.O_CREAT | os.O_EXCL) if create else os.O_RDWR, 0o600)
        try:
            if create:
                # reserve the pages now: a tmpfs that is too small fails here (ENOSPC), not with
                # SIGBUS at the first write in the middle of a step
                os.posix_fallocate(fd, 0, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.words = memoryview(self.map).cast("q")
        self.views = [torch.frombuffer(self.map, dtype=dtype, count=numel,
                                       offset=_BELL + k * self.slot_bytes + _HEADER).view(shape)
                      for k in range(n_slots)]
        self.addrs = [v.data_ptr() for v in self.views]
        self.heads = [(_BELL + k * self.slot_bytes) // 8 for k in range(n_slots)]  # seq's index in words
        self.bell_addr = ctypes.addressof(ctypes.c_int32.from_buffer(self.map, 0))
        self.ints = memoryview(self.map)[:_BELL].cast("i")  # [0]: the doorbell


class ShmTransport:
    """send / recv between pipeline neighbours through shared memory (see the module doc)."""

    def __init__(self, group: Group, rank_in_pp: int, p: int, v: int, m: int, shape: tuple[int, ...],
                 dtype: torch.dtype, token: str, timeout_s: float, receives: set, sends: set,
                 spin_s: float = 2e-3, handoff: bool = False, chunk_of: Callable[[int], int] | None = None):
        """`receives` / `sends`: the channels, each ``(what, peer)`` with ``peer`` the other end's
        pipeline rank, or just ``what`` for the round-robin neighbours (activations from the
        previous rank and to the next, gradients the other way).  On the V placement a rank takes
        activations from both sides (chunk 0 from r-1, chunk 1 from r+1), so channels are per
        (what, peer): one sender per segment.  `chunk_of(stage)`: the local chunk index of a stage
        on the rank that holds it (default stage // p, true of round-robin and of the V)."""
        self.group, self.p, self.v, self.m = group, p, v, m
        self.spin_s, self.handoff = spin_s, handoff
        self._ring = math.isfinite(spin_s)  # receivers that may sleep need their doorbell rung
        self.dtype = dtype
        self._numel = math.prod(shape)  # every message's size
        self._nbytes = self._numel * dtype.itemsize
        # counted here and handed to comm.COUNTER by flush_counts() (once a step: nothing on the
        # critical path); recv time is the time spent waiting for messages, a send never waits
        self.sends = self.recvs = 0
        self.waited = 0.0
        self._plain: torch.Tensor | None = None  # see _plain_bytes
        self._plain_ptr = 0
        self.timeout_s = timeout_s
        self.me = rank_in_pp
        self._chunk_of = chunk_of or (lambda stage: stage // p)
        # the default peers: activations come from the previous rank, gradients from the next
        self._from = {"act": (rank_in_pp - 1) % p, "grad": (rank_in_pp + 1) % p}
        self._to = {"act": (rank_in_pp + 1) % p, "grad": (rank_in_pp - 1) % p}
        inbound = sorted({c if isinstance(c, tuple) else (c, self._from[c]) for c in receives})
        outbound = sorted({c if isinstance(c, tuple) else (c, self._to[c]) for c in sends})
        me = group.ranks[rank_in_pp]
        self._inbox: dict[tuple[str, int], _Segment] = {}
        self._outbox: dict[tuple[str, int], _Segment] = {}
        self._received = {ch: [0] * (v * m) for ch in inbound}  # messages taken per (chunk, mb)
        self._sent = {ch: [0] * (v * m) for ch in outbound}
        self._paths = [_path(token, me, what, src) for what, src in inbound]
        self.token = token
        try:
            try:
                for (what, src), path in zip(inbound, self._paths):
                    self._inbox[(what, src)] = _Segment(path, 2 * v * m, shape, dtype, create=True)
                ok = 1
            except OSError:
                ok = 0
            _test_fault(me)
            self.ok = _all_ok(ok, group)
            if self.ok:
                for what, dst in outbound:
                    self._outbox[(what, dst)] = _Segment(_path(token, group.ranks[dst], what, rank_in_pp),
                                                         2 * v * m, shape, dtype, create=False)
            dist.barrier(group=group.pg)  # everyone has mapped what it needs: the names can go
        except BaseException:
            # a peer failed or vanished before every rank had mapped its segments: remove this
            # group's names (ours and a dead peer's; the mappings stay valid), so nothing outlives
            # the run in /dev/shm.  The local launcher removes what a killed world leaves as well.
            remove_files(token)
            raise
        self.unlink()

    def unlink(self) -> None:
        for path in self._paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._paths = []

    def _slot(self, tag_stage: int, mb: int) -> int:
        # every stage a rank receives for lives on that rank: its local chunk's slots
        return self._chunk_of(tag_stage) * self.m + mb

    def _next(self, counts: list[int], tag_stage: int, mb: int) -> tuple[int, int, int, int]:
        """Where the next message of (stage, micro-batch) goes, given the channel's message counts:
        (logical slot, physical slot, its seq once this message is published, messages so far)."""
        logical = self._slot(tag_stage, mb)
        k = counts[logical]
        # message k uses slot k mod 2 of its pair; it is that slot's (k // 2 + 1)-th message
        return logical, 2 * logical + (k & 1), k // 2 + 1, k

    def send(self, t: torch.Tensor, what: str, tag_stage: int, mb: int, peer: int | None = None) -> None:
        """Copy `t` into the slot of pipeline rank `peer` (default: the round-robin neighbour) and
        publish it; returns at once (never waits for the receiver, see the module doc)."""
        ch = (what, self._to[what] if peer is None else peer)
        seg = self._outbox[ch]
        n = self._sent[ch]
        logical, slot, seq, k = self._next(n, tag_stage, mb)
        h = seg.heads[slot]
        if seg.words[h + 1] != seq - 1:  # its previous message not taken yet (see the module doc)
            _wait_until(seg, h + 1, seq - 1, 2e-3, self.timeout_s,
                        f"{what} slot {slot} to be freed by rank {self.group.ranks[ch[1]]}",
                        doorbell=False)
        src = self._plain_ptr if t is self._plain else self._plain_bytes(t)
        if src:
            _memmove(seg.addrs[slot], src, self._nbytes)
        else:
            seg.views[slot].copy_(t.detach())
        seg.words[h] = seq  # publish: after the bytes (TSO keeps the order)
        if self._ring:
            seg.ints[0] += 1  # one sender per segment: no race on the increment
            _futex_wake(seg.bell_addr)
        n[logical] = k + 1
        self.sends += 1
        if self.handoff:
            os.sched_yield()  # a receiver polling on this core takes it now (see the module doc)

    def _plain_bytes(self, t: torch.Tensor) -> int:
        """The address of `t`'s bytes if one memmove can send it (contiguous, the slot's dtype and
        size), else 0.  Why not always `copy_`: right after a sleep, on the VM this was measured
        on, every torch call costs ~10 us (copy_ ~20 us, memmove ~12 us, measured interleaved).
        A tensor without autograd history (a synthetic stage's fixed output) is remembered, so
        sending it again costs no torch call at all; the runtime never changes a sent tensor's
        layout in place."""
        if not (t.dtype is self.dtype and t.nbytes == self._nbytes and t.is_contiguous()):
            return 0
        ptr = t.data_ptr()
        if not t.requires_grad:  # holding it keeps no autograd graph alive
            self._plain, self._plain_ptr = t, ptr
        return ptr

    def recv(self, what: str, tag_stage: int, mb: int, peer: int | None = None) -> torch.Tensor:
        """Wait for the message from pipeline rank `peer` (default: the round-robin neighbour) and
        return it in place: a view of the slot, valid until the end of the next step (read it, do
        not write it)."""
        ch = (what, self._from[what] if peer is None else peer)
        seg = self._inbox[ch]
        n = self._received[ch]
        logical, slot, seq, k = self._next(n, tag_stage, mb)
        h = seg.heads[slot]
        if seg.words[h] != seq:
            t0 = time.perf_counter()
            _wait_until(seg, h, seq, self.spin_s, self.timeout_s,
                        f"{what} (stage/micro-batch slot {logical}) from rank {self.group.ranks[ch[1]]}")
            self.waited += time.perf_counter() - t0
        seg.words[h + 1] = seq  # ack
        n[logical] = k + 1
        self.recvs += 1
        return seg.views[slot]

    def flush_counts(self) -> None:
        """Add the messages since the last flush to comm.COUNTER (the runtime: after each step)."""
        if self.sends:
            comm.COUNTER.add_sized(self.group.name, "send", self._numel, self.dtype.itemsize, 0.0,
                                   calls=self.sends)
        if self.recvs:
            comm.COUNTER.add_sized(self.group.name, "recv", self._numel, self.dtype.itemsize, self.waited,
                                   calls=self.recvs)
        self.sends = self.recvs = 0
        self.waited = 0.0


def _path(token: str, rank: int, what: str, src: int) -> str:
    """The segment global rank `rank` receives `what` on from pipeline rank `src`."""
    return os.path.join(_DIR, f"par3d-{token}-r{rank}-{what}-from{src}")


def remove_files(prefix: str) -> list[str]:
    """Unlink every segment whose token starts with `prefix` (a run's id, or one group's token);
    the names removed.  Mapped segments stay valid until unmapped: only the names go."""
    removed = []
    for path in glob.glob(os.path.join(_DIR, f"par3d-{glob.escape(prefix)}*")):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


_FAULT_VAR = "PAR3D_TEST_SHM_FAULT"


def _test_fault(rank: int) -> None:
    """TEST-ONLY: PAR3D_TEST_SHM_FAULT="RANK:raise|kill|hang" makes global rank RANK fail while its
    segments exist and before its peers have mapped them (the window in which a failure could
    leave files in /dev/shm).  Never set it in a real run."""
    spec = os.environ.get(_FAULT_VAR)
    if not spec:
        return
    r, how = spec.split(":")
    if int(r) != rank:
        return
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "raise":
        raise RuntimeError(f"injected failure on rank {rank} in the shared-memory set-up ({_FAULT_VAR})")
    while True:
        time.sleep(1)


def _wait_until(seg: _Segment, word: int, want: int, spin_s: float, timeout_s: float, waiting_for: str,
                doorbell: bool = True) -> None:
    """Until `seg.words[word] == want`: yield for `spin_s`, then sleep — on the segment's doorbell
    (rung by the sender after each message), or 100 us at a time without one."""
    t0 = time.perf_counter()
    words = seg.words
    while words[word] != want:
        waited = time.perf_counter() - t0
        if waited >= timeout_s:
            raise TimeoutError(f"pipeline transfer: waited {timeout_s:g} s for {waiting_for} "
                               "(is that rank alive? raise --timeout for slower stages)")
        if waited < spin_s:
            os.sched_yield()
            continue
        if not doorbell:
            time.sleep(1e-4)
            continue
        bell = seg.ints[0]
        if words[word] == want:  # published between our two looks
            break
        _futex_wait(seg.bell_addr, bell, min(0.05, timeout_s - waited))


def _all_ok(ok: int, group: Group) -> bool:
    flags = torch.tensor([ok], dtype=torch.int64)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=group.pg)
    return bool(flags.item())


def eligible_here(device: torch.device) -> bool:
    """This rank could use shared memory: CPU tensors, x86-64 (TSO), Linux with /dev/shm."""
    return (device.type == "cpu" and sys.platform == "linux" and platform.machine().lower() in ("x86_64", "amd64")
            and os.path.isdir(_DIR) and os.access(_DIR, os.W_OK))


def waiting_policy(ranks_compute: bool = True, local_ranks: int | None = None,
                   cores: int | None = None) -> tuple[float, bool]:
    """(seconds a receiver polls before it sleeps on the doorbell, whether a sender yields its
    core after publishing) — see the module doc.  Defaults: this host's ranks and usable cores."""
    if local_ranks is None:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:
            cores = os.cpu_count() or 1
    crowded = local_ranks > cores
    if not ranks_compute:
        return math.inf, crowded
    return (5e-5 if crowded else 2e-3), False


def host_key() -> str:
    """Two ranks share memory only if they share a kernel: hostname and boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def agree(group: Group, device: torch.device, mode: str) -> str | None:
    """Collective over the pipeline group: a shared token if every rank can use shared memory with
    every other, else None.  `mode` "shm" makes "cannot" an error instead of a fallback."""
    if mode == "auto" and device.type != "cpu":
        return None  # GPU tensors: the backend (NCCL) is the transport; every rank decides alike
    # the token starts with the local launcher's run id, so the launcher can find what its world
    # left in /dev/shm however the world ended (distributed.py)
    run_id = os.environ.get("PAR3D_RUN_ID", "")
    mine = (host_key(), eligible_here(device), f"{run_id}-{secrets.token_hex(6)}" if run_id else secrets.token_hex(6))
    everyone: list[Any] = [None] * group.size
    dist.all_gather_object(everyone, mine, group=group.pg)
    same_host = len({h for h, _, _ in everyone}) == 1
    able = all(e for _, e, _ in everyone)
    if same_host and able:
        return str(everyone[0][2])
    if mode == "shm":
        why = "ranks of one pipeline group are on different hosts" if not same_host else \
            "a rank has GPU tensors, is not x86-64, or has no writable /dev/shm"
        raise RuntimeError(f"parallel.p2p='shm' cannot be used: {why}; use --p2p auto or --p2p backend")
    return None
