"""The runtime profile: what a machine and par3d's own runtime add to the planner's step-time model.

There is one step-time model (`plan/cost.py`).  On a GPU cluster its arithmetic — GEMMs on a
roofline, α-β collectives, the schedule's simulated bubble — is the whole story.  On a CPU host
running par3d's eager runtime, costs that are noise on a GPU dominate small runs.  They are not a
second predictor but a *profile* that `cost.py` takes through `Cluster.profile` (so `par3d plan
--hardware FILE` and the end-of-run report of `par3d train --hardware FILE` give the same number):

- `overheads`: fixed costs of one transformer block's forward / backward (Python, autograd, the
  dispatch of its ~40 kernels), of one pipeline action apart from its blocks, and of one optimizer
  step — measured by `par3d calibrate` on a GPT so small that its arithmetic is negligible;
- `kernels`: measured CPU primitives (a GEMM time fit over shapes, elementwise ops over sizes,
  attention), replacing the GPU roofline of `compute.py` for the time of a block's arithmetic;
- `p2p` and `hop`: the pipeline transport (α-β of isolated sends, and what a transfer costs
  inside a running step beyond that: posting the send, waking the receiver);
- `cp_link`: context parallelism's ring exchange through the backend (α-β of isolated exchanges);
- `collectives`: per kind (all-gather, reduce-scatter, all-reduce) the α-β of isolated calls over
  the calibration's ranks — what ZeRO-3's per-unit gathers and reduce-scatters cost each;
- `point_sync`: what a point where the ranks of a TP or CP group meet inside a step (a TP
  all-reduce, a ring-attention exchange) costs beyond the α-β fit of isolated calls: a fixed
  latency per point and a skew in proportion to the CPU work since the last point (the partner
  drifts while computing) — both measured by `par3d calibrate` with one rank per core and with
  two (`collective_sync`), and read at the ranks per core of the layout being priced
  (`SyncModel.at`); a rank waiting there keeps its core (the backend polls), so with more ranks
  than cores the wait is time-shared like compute;
- `sync` (files written before `collective_sync`): one constant per collective message step,
  added to every link's α;
- `cores`, `corun`, `oversub`: busy ranks beyond the host's cores time-share them, and ranks
  running side by side slow each other (shared caches, memory bandwidth); `corun_fixed`,
  `oversub_fixed`: the same for the fixed costs (the Python and autograd bookkeeping around the
  primitives, per block, action and step), which lose more to a second rank than the arithmetic
  does — both pairs fitted together on three calibration GPTs (files without them: the fixed costs
  slow like the arithmetic);
- `solo`: how much slower the primitives run inside a whole model's step on one rank than timed
  one by one (a primitive repeated alone keeps its operands hot in the caches; in a step forty
  kernels follow each other), measured by `par3d calibrate` on its calibration GPTs at one rank;
- `bw_full_backward`: a runtime whose BW re-walks the graph BI kept (eager ZB-H1 before issue 17),
  so BW costs a whole backward, not only the weight GEMMs.  A property of the runtime, not of the
  machine (`RUNTIME_BW_FULL_BACKWARD`): off since `pipeline/runtime.py` splits the backward for
  real (`par3d.weight_grad`).

A hardware file without these fields (a catalogue-like GPU description) gives no profile, and the
planner's model is exactly the GPU one.  Importing this module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .hardware import GB, US, Cluster, Link

if TYPE_CHECKING:
    from .hardware import HardwareFile
    from .kernels import KernelModel

# pipeline/runtime.py splits the backward for real (par3d.weight_grad, issue 17): BI keeps each
# linear layer's (x, dy) and BW runs only the weight GEMMs, measured at BI + BW = 1.18x B on a 23 ms chunk (1.53x before)
# (benchmarks/results/split_backward.json).  True described the runtime before it, whose BW walked
# the retained graph again (a whole backward).
RUNTIME_BW_FULL_BACKWARD = False


@dataclass(frozen=True)
class Overheads:
    """Fixed costs per block, per pipeline action and per step (seconds); zero for a GPU file."""

    layer_f_s: float = 0.0
    layer_b_s: float = 0.0
    action_f_s: float = 0.0
    action_b_s: float = 0.0
    step_s: float = 0.0

    @staticmethod
    def from_dict(d: dict[str, Any] | None) -> Overheads:
        d = d or {}
        return Overheads(**{k: float(d.get(k, 0.0) or 0.0) for k in Overheads.__dataclass_fields__})


@dataclass(frozen=True)
class SyncModel:
    """The in-step cost of a synchronisation point, measured at a few ranks-per-core loads:
    `latency_s[i]` seconds per point plus `skew[i]` times the CPU work since the last point, with
    `ranks_per_core[i]` ranks on each core.  Linear in between, flat outside the measured range."""

    ranks_per_core: tuple[float, ...]
    latency_s: tuple[float, ...]
    skew: tuple[float, ...]

    def at(self, ranks_per_core: float) -> tuple[float, float]:
        """(latency, skew) with `ranks_per_core` ranks on each core."""
        xs = self.ranks_per_core
        if ranks_per_core <= xs[0]:
            return self.latency_s[0], self.skew[0]
        for i in range(1, len(xs)):
            if ranks_per_core <= xs[i]:
                w = (ranks_per_core - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ((1 - w) * self.latency_s[i - 1] + w * self.latency_s[i],
                        (1 - w) * self.skew[i - 1] + w * self.skew[i])
        return self.latency_s[-1], self.skew[-1]

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SyncModel:
        """`collective_sync` of a hardware file: {"ranks_per_core": [...], "latency_us": [...],
        "skew": [...]} (equal lengths, ranks per core increasing)."""
        xs = tuple(float(x) for x in d["ranks_per_core"])
        lat = tuple(float(x) * US for x in d["latency_us"])
        sk = tuple(float(x) for x in d["skew"])
        if not xs or len(xs) != len(lat) or len(xs) != len(sk) or list(xs) != sorted(set(xs)):
            raise ValueError(f"collective_sync: ranks_per_core, latency_us and skew must be lists of one length "
                             f"with ranks_per_core increasing, got {d!r}")
        return SyncModel(xs, lat, sk)


@dataclass(frozen=True)
class Profile:
    """The terms above; every default leaves the planner's GPU model unchanged."""

    overheads: Overheads = field(default_factory=Overheads)
    p2p: Link | None = None
    hop: float = 0.0
    sync: float = 0.0
    cores: int | None = None
    solo: float = 1.0
    corun: float = 1.0
    oversub: float = 1.0
    corun_fixed: float | None = None  # None: as `corun` / `oversub`
    oversub_fixed: float | None = None
    bw_full_backward: bool = False
    kernels: KernelModel | None = None
    cp_link: Link | None = None
    collectives: tuple[tuple[str, Link], ...] = ()
    point_sync: SyncModel | None = None
    # kernels run asynchronously to the host that issues them (a GPU file: `host.gpu` named): the fixed costs
    # overlap the arithmetic instead of adding to it (cost._add_runtime_costs)
    asynchronous: bool = False

    def collective(self, kind: str) -> Link | None:
        """The isolated calls' α-β link of one collective kind, if calibrated."""
        return next((lk for k, lk in self.collectives if k == kind), None)


RUNTIME_KEYS = ("overheads", "links", "cores", "solo_slowdown", "corun_slowdown", "oversubscribed_slowdown",
                "corun_fixed_slowdown", "oversubscribed_fixed_slowdown", "collective_sync_us",
                "collective_sync", "pipeline_hop_us", "kernels")


def profile_of(hw: HardwareFile) -> Profile | None:
    """The profile a hardware file describes (`par3d calibrate` writes every field); None when it
    has none of them, i.e. a plain device-and-links description."""
    x = hw.extra
    if not any(k in x for k in RUNTIME_KEYS):
        return None
    p2p = (x.get("links") or {}).get("p2p")
    corun = float(x.get("corun_slowdown", 1.0) or 1.0)
    kernels = None
    if x.get("kernels"):
        from .kernels import KernelModel

        kernels = KernelModel.from_dict(x["kernels"])
    rt = x.get("runtime") or {}
    cpl = (x.get("links") or {}).get("cp")
    colls = []
    for kind, by_group in sorted((x.get("collective_fits") or {}).items()):
        if kind in ("all_gather", "reduce_scatter", "all_reduce") and isinstance(by_group, dict) and by_group:
            f = by_group[min(by_group, key=int)]  # the smallest group: ZeRO-3 over 2 ranks here
            colls.append((kind, Link(kind, f["alpha_us"] * US, f["bw_gbps"] * GB)))
    point_sync = SyncModel.from_dict(x["collective_sync"]) if x.get("collective_sync") else None
    return Profile(
        overheads=Overheads.from_dict(x.get("overheads")),
        p2p=Link("p2p", p2p["alpha_us"] * US, p2p["bw_gbps"] * GB) if p2p else None,
        hop=float(x.get("pipeline_hop_us", 0.0) or 0.0) * US,
        # the per-point model replaces the older constant per message step
        sync=0.0 if point_sync is not None else float(x.get("collective_sync_us", 0.0) or 0.0) * US,
        cores=int(x["cores"]) if x.get("cores") else None,
        solo=float(x.get("solo_slowdown", 1.0) or 1.0),
        corun=corun,
        oversub=float(x.get("oversubscribed_slowdown", corun) or corun),
        corun_fixed=float(x["corun_fixed_slowdown"]) if x.get("corun_fixed_slowdown") else None,
        oversub_fixed=float(x["oversubscribed_fixed_slowdown"]) if x.get("oversubscribed_fixed_slowdown") else None,
        bw_full_backward=bool(rt.get("bw_full_backward", RUNTIME_BW_FULL_BACKWARD)),
        kernels=kernels,
        cp_link=Link("cp", cpl["alpha_us"] * US, cpl["bw_gbps"] * GB) if cpl else None,
        collectives=tuple(colls),
        point_sync=point_sync,
        asynchronous=bool((x.get("host") or {}).get("gpu")))


def contention(prof: Profile | None, world: int, busy: float | None = None, fixed: bool = False) -> float:
    """How much slower each rank computes when `world` ranks share the host's cores, `busy` of them
    computing at any moment on average (default: all): busy ranks beyond the cores time-share
    them (busy/cores), and ranks running side by side slow each other — the calibrated co-run
    slowdown: 1 alone, `corun` with every core busy, `oversub` with twice as many busy ranks as
    cores; linear in between, flat beyond.  `fixed`: the slowdown of the fixed costs
    (`corun_fixed`, `oversub_fixed`) instead of the arithmetic's."""
    if prof is None or not prof.cores or world == 1:
        return 1.0
    busy = world if busy is None else busy
    k = prof.cores
    corun, oversub = prof.corun, prof.oversub
    if fixed:
        corun = prof.corun_fixed if prof.corun_fixed is not None else corun
        oversub = prof.oversub_fixed if prof.oversub_fixed is not None else oversub
    if busy <= k:
        extra = 1.0 + (corun - 1.0) * max(0.0, busy - 1.0) / max(1, k - 1)
    else:
        extra = corun + (oversub - corun) * min(1.0, (busy - k) / k)
    return max(1.0, busy / k) * extra


def checked_profile(hw: HardwareFile) -> Profile | None:
    """`profile_of`, with a field of the wrong shape (a file `par3d calibrate` wrote, then damaged) refused as a
    HardwareError that names the fields and the mend instead of a traceback."""
    try:
        return profile_of(hw)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        from .hardware import HardwareError

        what = f"missing {e}" if isinstance(e, KeyError) else str(e)
        raise HardwareError(f"its host profile (the fields `par3d calibrate` writes: {', '.join(RUNTIME_KEYS)}, "
                            f"collective_fits, host) is malformed ({what}); run `par3d calibrate` again on that "
                            "host, or drop those fields to plan on the device and links alone") from None


def cluster_from_file(hw: HardwareFile, gpus: int, dtype: str, gpus_per_node: int | None = None) -> Cluster:
    """The cluster a hardware file describes for `gpus` ranks, with its runtime profile: what both
    `par3d plan --hardware FILE` and the end-of-run prediction of `par3d train --hardware FILE`
    evaluate, so that they agree.  A file with a host's core count describes one machine: every
    rank is on it (one node); otherwise `gpus_per_node` (flag, file, or 8)."""
    prof = checked_profile(hw)
    if gpus_per_node is None:
        gpus_per_node = gpus if prof is not None and prof.cores else (hw.gpus_per_node or 8)
    cv = hw.extra.get("straggler_cv")  # the file's own GPU spread (hardware.Cluster.straggler_cv), if it gives one
    if cv is not None and (not isinstance(cv, (int, float)) or isinstance(cv, bool) or not 0 <= cv <= 0.5):
        from .hardware import HardwareError

        raise HardwareError(f"straggler_cv={cv!r} must be a fraction in [0, 0.5] (0.015 = a 1.5 % spread of the "
                            f"GPUs' step times); drop it to take the default")
    rt = hw.extra.get("runtime") or {}
    elementwise = rt.get("elementwise", "fused")
    if elementwise not in ("fused", "eager"):
        from .hardware import HardwareError

        raise HardwareError(f"runtime.elementwise={elementwise!r} must be 'fused' (Megatron-Core's kernels) or "
                            f"'eager' (par3d's own runtime); drop it for fused")
    return Cluster(hw.device, gpus, min(gpus_per_node, gpus), hw.intra, hw.inter, dtype, prof,
                   straggler_cv=None if cv is None else float(cv), elementwise=elementwise)


__all__ = ["Overheads", "Profile", "SyncModel", "RUNTIME_BW_FULL_BACKWARD", "checked_profile", "cluster_from_file",
           "contention", "profile_of"]
