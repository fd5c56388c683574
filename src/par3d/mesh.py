"""The layout of ranks: global rank <-> (dp, pp, cp, tp) coordinates, in one place.

TP varies fastest (consecutive ranks share a node's fast links), then CP (its ring passes K/V
blocks in every attention layer, forward and backward), then PP, then DP — the seed's rule
(section 2.5) that the most frequent communication gets the fastest link:

    rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank

With cp = 1 this is the (dp, pp, tp) layout of before.  Nothing else in par3d does rank
arithmetic.  The pure part (this class) needs no processes and no torch; `build_groups` creates
the torch process groups from it.

Groups (each the ranks that differ in one coordinate only): tp, cp, pp, dp; `dpcp` joins dp and
cp — the ranks that hold the same parameters (a CP rank sees part of every sequence, a DP rank
part of the batch), so gradients are reduced and ZeRO shards over it (as Megatron-LM's
data-parallel-with-context group); `embed` is the first and last pipeline stage of a column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Coord:
    dp: int
    pp: int
    tp: int
    cp: int = 0


@dataclass(frozen=True)
class Mesh:
    dp: int
    pp: int
    tp: int
    cp: int = 1
    # the pipeline rank that holds the head (the model's last chunk): the last one, except in the V schedules
    # (zb-v, dualpipe-v), whose last chunk comes back to rank 0 beside the embedding (`schedules.placement`)
    head_pp: int | None = None

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp", "cp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"Mesh.{name}={v!r} must be an integer >= 1")
        if self.head_pp is not None and not (isinstance(self.head_pp, int) and 0 <= self.head_pp < self.pp):
            raise ValueError(f"Mesh.head_pp={self.head_pp!r} must be a pipeline rank, 0 .. {self.pp - 1}")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    def rank(self, dp: int, pp: int, tp: int, cp: int = 0) -> int:
        if not (0 <= dp < self.dp and 0 <= pp < self.pp and 0 <= tp < self.tp and 0 <= cp < self.cp):
            raise ValueError(f"coordinate (dp={dp}, pp={pp}, cp={cp}, tp={tp}) outside mesh {self}")
        return ((dp * self.pp + pp) * self.cp + cp) * self.tp + tp

    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of size {self.world_size}")
        tp = rank % self.tp
        cp = (rank // self.tp) % self.cp
        pp = (rank // (self.tp * self.cp)) % self.pp
        dp = rank // (self.tp * self.cp * self.pp)
        return Coord(dp, pp, tp, cp)

    # ---- groups: each is a list of global ranks, ordered by the varying coordinate ----------
    def tp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(c.dp, c.pp, t, c.cp) for t in range(self.tp)]

    def cp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(c.dp, c.pp, c.tp, k) for k in range(self.cp)]

    def pp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(c.dp, p, c.tp, c.cp) for p in range(self.pp)]

    def dp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(d, c.pp, c.tp, c.cp) for d in range(self.dp)]

    def dpcp_group(self, rank: int) -> list[int]:
        """Every rank holding the same parameters as `rank` (same pp and tp), in rank order."""
        c = self.coord(rank)
        return sorted(self.rank(d, c.pp, c.tp, k) for d in range(self.dp) for k in range(self.cp))

    def embed_group(self, rank: int) -> list[int]:
        """The pipeline ranks of this (dp, cp, tp) column that hold the embedding and the head: the two copies of a
        tied embedding, whose gradients they sum.  A single rank when pp == 1, and in the V schedules, where
        both ends are chunks of pipeline rank 0 (the two copies are then summed on that rank)."""
        c = self.coord(rank)
        head = self.pp - 1 if self.head_pp is None else self.head_pp
        ends = sorted({self.rank(c.dp, 0, c.tp, c.cp), self.rank(c.dp, head, c.tp, c.cp)})
        return ends

    def all_groups(self, kind: str) -> list[list[int]]:
        """Every distinct group of one kind, in a fixed order (all ranks must create groups in
        the same order)."""
        fn = {"tp": self.tp_group, "cp": self.cp_group, "pp": self.pp_group, "dp": self.dp_group,
              "dpcp": self.dpcp_group, "embed": self.embed_group}[kind]
        seen: list[list[int]] = []
        for r in range(self.world_size):
            g = fn(r)
            if g not in seen:
                seen.append(g)
        return seen

    def stage_neighbours(self, rank: int) -> tuple[int | None, int | None]:
        """(previous, next) rank along the pipeline, None at the ends (no wrap-around)."""
        c = self.coord(rank)
        prev_r = self.rank(c.dp, c.pp - 1, c.tp, c.cp) if c.pp > 0 else None
        next_r = self.rank(c.dp, c.pp + 1, c.tp, c.cp) if c.pp < self.pp - 1 else None
        return prev_r, next_r

    def pp_rank_to_global(self, rank: int, pp_rank: int) -> int:
        """Global rank of pipeline rank `pp_rank` in this rank's (dp, cp, tp) column."""
        c = self.coord(rank)
        return self.rank(c.dp, pp_rank % self.pp, c.tp, c.cp)


@dataclass
class Group:
    """A named process group as this rank sees it.  `pg` is None when the group has one rank
    (every collective on it is then a no-op, so the model is its own single-device reference)."""

    name: str
    ranks: list[int]
    rank: int  # this process's index inside the group
    pg: Any = None

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass
class Groups:
    mesh: Mesh
    global_rank: int
    coord: Coord
    tp: Group
    pp: Group
    dp: Group
    embed: Group
    world: Group
    pp_grad: Group | None = None  # same ranks as pp; a second channel for backward transfers
    # same ranks as pp again: messages against their usual direction (the interleaved schedule's
    # wrap-around, the V's way back; schedules.p2p_channel), so that between two ranks each
    # communicator carries one direction
    pp_wrap: Group | None = None
    pp_grad_wrap: Group | None = None
    cp: Group | None = None  # None only for Groups built by hand; build_groups always sets it
    dpcp: Group | None = None  # dp x cp: where gradients are reduced and ZeRO shards (= dp when cp == 1)
    # (channel, pipeline rank a, pipeline rank b), a < b -> a group of those two ranks alone, for
    # each channel (schedules.p2p_channel) of each pair that exchanges messages; built on request
    # (NCCL, --p2p backend) when pp > 2 (at pp = 2 the twins above are such groups already)
    p2p: dict[tuple[str, int, int], Group] = field(default_factory=dict)

    @property
    def cp_group(self) -> Group:
        return self.cp if self.cp is not None else Group("cp", [self.global_rank], 0, None)

    @property
    def grad_group(self) -> Group:
        """The ranks that hold this rank's parameters: gradients are summed over it."""
        return self.dpcp if self.dpcp is not None else self.dp


P2P_CHANNELS = ("act", "grad", "act_wrap", "grad_wrap")  # schedules.p2p_channel's names

# process groups already made in this process for its current default group, by (kind, ranks,
# timeout): a process that runs several layouts one after another (`bench fidelity`'s worlds, the
# tests' shared worlds) reuses a group instead of making another.  Each gloo group keeps its threads
# for the life of the process; made anew per run they piled up, and every layout ran slower than the
# one before it (1.2-1.5x by the end of a 2-rank world of 60 layouts on two cores, docs/measured.md §2).
_GROUPS: dict[tuple[Any, ...], Any] = {}
_GROUPS_WORLD: list[Any] = [None]  # the default group the cache belongs to (held, so it is never a new one's twin)


def _group(kind: str, ranks: list[int], kw: dict[str, Any]) -> Any:
    """`dist.new_group(ranks)` for this kind, or the one made before with the same key.  Collective
    like `new_group`: every rank of the world calls it in the same order with the same arguments, so
    every rank finds the key in its cache or none does."""
    import torch.distributed as dist

    if _GROUPS_WORLD[0] is not dist.group.WORLD:  # a new default group: the old groups are gone
        _GROUPS.clear()
        _GROUPS_WORLD[0] = dist.group.WORLD
    key = (kind, tuple(ranks), kw.get("timeout"))
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(ranks, **kw)
    return _GROUPS[key]


def build_groups(mesh: Mesh, global_rank: int, timeout_s: float | None = None,
                 p2p_pairs: list[tuple[int, int]] | None = None, backend_p2p: bool = True) -> Groups | None:
    """Create every torch process group (collectively: every rank of the torch world must call
    this, with the same arguments).  The mesh may use only the first `mesh.world_size` ranks of a
    larger world (tests run many layouts in one world); ranks outside it get None.

    `p2p_pairs`: pairs (a, b), a < b, of pipeline ranks that exchange messages; for each, in
    every pipeline column, one group of the two ranks per channel (`Groups.p2p`).  Why: NCCL runs
    a communicator's operations one after another, and on a group initialised eagerly (torch does
    so when `init_process_group` gets a device, as par3d's does) every send and receive of the
    group, to any peer, shares one communicator; a two-rank group per (channel, pair) makes the
    communicators exactly what `schedules.nccl_problems` replays, however torch picks them.

    `backend_p2p`: whether the backend carries pipeline messages (NCCL; gloo with --p2p backend).
    When it does not (the shared-memory transport), the pp twins are not built: every extra gloo
    group keeps two threads polling for its whole life, and on two cores eight ranks' worth of
    unused ones slow every rank down."""
    from datetime import timedelta

    import torch.distributed as dist

    made: dict[str, Group] = {}
    initialized = dist.is_initialized()
    if initialized:
        # every rank of the world starts the run together, as `new_group` made them do when every run
        # made its own groups: a rank outside a small layout (tests run many in one world) must not
        # race into the next run's collectives while the layout's ranks are still finishing theirs
        dist.barrier()
    # subgroups do not inherit the world's timeout (torch gives them 30 minutes): pass ours, so a
    # collective whose peer died fails within the run's --timeout
    kw = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
    twins = ("pp_grad", "pp_wrap", "pp_grad_wrap") if backend_p2p else ()
    kinds = ["tp", "cp", "pp", "dp", "embed", *twins] + (["dpcp"] if mesh.cp > 1 and mesh.dp > 1 else [])
    for kind in kinds:
        for ranks in mesh.all_groups("pp" if kind in twins else kind):
            pg = _group(kind, ranks, kw) if len(ranks) > 1 and initialized else None
            if global_rank in ranks:
                # the pp twins: activations and gradients, each way, travel on separate
                # communicators, so a transport that matches messages by order and runs a
                # communicator's operations one after another (NCCL) neither mixes two streams nor
                # queues a send behind a receive of the other direction (schedules.nccl_problems)
                made[kind] = Group("pp" if kind in twins else kind, ranks, ranks.index(global_rank), pg)
    pairs = sorted({(min(a, b), max(a, b)) for a, b in (p2p_pairs or []) if a != b}) if mesh.pp > 2 else []
    p2p: dict[tuple[str, int, int], Group] = {}
    for col in mesh.all_groups("pp"):
        for a, b in pairs:
            for ch in P2P_CHANNELS:
                ranks = [col[a], col[b]]
                pg = _group(f"p2p-{ch}", ranks, kw) if initialized else None
                if global_rank in ranks:
                    p2p[(ch, a, b)] = Group("pp", ranks, ranks.index(global_rank), pg)
    world_ranks = list(range(mesh.world_size))
    world_pg = None
    if initialized and mesh.world_size > 1:
        whole = mesh.world_size == dist.get_world_size()
        world_pg = dist.group.WORLD if whole else _group("world", world_ranks, kw)
    if global_rank >= mesh.world_size:
        return None
    # middle pipeline stages hold no embedding copy: a group of their own
    made.setdefault("embed", Group("embed", [global_rank], 0, None))
    made["world"] = Group("world", world_ranks, global_rank, world_pg)
    # dp x cp is the dp group when cp == 1 and the cp group when dp == 1: no second communicator
    dpcp = made.get("dpcp") or (made["dp"] if mesh.cp == 1 else made["cp"])
    dpcp = Group("dp", dpcp.ranks, dpcp.rank, dpcp.pg)  # counted as DP traffic either way
    return Groups(mesh, global_rank, mesh.coord(global_rank), made["tp"], made["pp"], made["dp"],
                  made["embed"], made["world"], pp_grad=made.get("pp_grad"), cp=made["cp"], dpcp=dpcp,
                  pp_wrap=made.get("pp_wrap"), pp_grad_wrap=made.get("pp_grad_wrap"), p2p=p2p)

