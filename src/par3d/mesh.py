"""The layout of ranks: global rank <-> (dp, pp, tp) coordinates, in one place.

TP varies fastest (consecutive ranks share a node's fast links), then PP, then DP — the seed's
rule (section 2.5) that the most frequent communication gets the fastest link:

    rank = (dp_rank * pp + pp_rank) * tp + tp_rank

Nothing else in par3d does rank arithmetic.  The pure part (this class) needs no processes and
no torch; `build_groups` creates the torch process groups from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Coord:
    dp: int
    pp: int
    tp: int


@dataclass(frozen=True)
class Mesh:
    dp: int
    pp: int
    tp: int

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"Mesh.{name}={v!r} must be an integer >= 1")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    def rank(self, dp: int, pp: int, tp: int) -> int:
        if not (0 <= dp < self.dp and 0 <= pp < self.pp and 0 <= tp < self.tp):
            raise ValueError(f"coordinate (dp={dp}, pp={pp}, tp={tp}) outside mesh {self}")
        return (dp * self.pp + pp) * self.tp + tp

    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of size {self.world_size}")
        tp = rank % self.tp
        pp = (rank // self.tp) % self.pp
        dp = rank // (self.tp * self.pp)
        return Coord(dp, pp, tp)

    # ---- groups: each is a list of global ranks, ordered by the varying coordinate ----------
    def tp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(c.dp, c.pp, t) for t in range(self.tp)]

    def pp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(c.dp, p, c.tp) for p in range(self.pp)]

    def dp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(d, c.pp, c.tp) for d in range(self.dp)]

    def embed_group(self, rank: int) -> list[int]:
        """First and last pipeline stage of this (dp, tp) column: they hold the two copies of a
        tied embedding and sum its gradient.  A single rank when pp == 1."""
        c = self.coord(rank)
        ends = sorted({self.rank(c.dp, 0, c.tp), self.rank(c.dp, self.pp - 1, c.tp)})
        return ends

    def all_groups(self, kind: str) -> list[list[int]]:
        """Every distinct group of one kind, in a fixed order (all ranks must create groups in
        the same order)."""
        fn = {"tp": self.tp_group, "pp": self.pp_group, "dp": self.dp_group,
              "embed": self.embed_group}[kind]
        seen: list[list[int]] = []
        for r in range(self.world_size):
            g = fn(r)
            if g not in seen:
                seen.append(g)
        return seen

    def stage_neighbours(self, rank: int) -> tuple[int | None, int | None]:
        """(previous, next) rank along the pipeline, None at the ends (no wrap-around)."""
        c = self.coord(rank)
        prev_r = self.rank(c.dp, c.pp - 1, c.tp) if c.pp > 0 else None
        next_r = self.rank(c.dp, c.pp + 1, c.tp) if c.pp < self.pp - 1 else None
        return prev_r, next_r

    def pp_rank_to_global(self, rank: int, pp_rank: int) -> int:
        """Global rank of pipeline rank `pp_rank` in this rank's (dp, tp) column."""
        c = self.coord(rank)
        return self.rank(c.dp, pp_rank % self.pp, c.tp)


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




def build_groups(mesh: Mesh, global_rank: int, timeout_s: float | None = None) -> Groups | None:
    """Create every torch process group (collectively: every rank of the torch world must call
    this).  The mesh may use only the first `mesh.world_size` ranks of a larger world (tests run
    many layouts in one world); ranks outside it get None."""
    from datetime import timedelta

    import torch.distributed as dist

    made: dict[str, Group] = {}
    initialized = dist.is_initialized()
    # subgroups do not inherit the world's timeout (torch gives them 30 minutes): pass ours, so a
    # collective whose peer died fails within the run's --timeout
    kw = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
    for kind in ("tp", "pp", "dp", "embed", "pp_grad"):
        for ranks in mesh.all_groups("pp" if kind == "pp_grad" else kind):
            pg = dist.new_group(ranks, **kw) if len(ranks) > 1 and initialized else None
            if global_rank in ranks:
                # pp_grad: activations and gradients travel on separate communicators, so a
                # transport that matches messages by order (NCCL) never mixes the two streams
                made[kind] = Group("pp" if kind == "pp_grad" else kind, ranks, ranks.index(global_rank), pg)
    world_ranks = list(range(mesh.world_size))
    world_pg = None
    if initialized and mesh.world_size > 1:
        whole = mesh.world_size == dist.get_world_size()
        world_pg = dist.group.WORLD if whole else dist.new_group(world_ranks, **kw)
    if global_rank >= mesh.world_size:
        return None
    # middle pipeline stages hold no embedding copy: a group of their own
    made.setdefault("embed", Group("embed", [global_rank], 0, None))
    made["world"] = Group("world", world_ranks, global_rank, world_pg)
    return Groups(mesh, global_rank, mesh.coord(global_rank), made["tp"], made["pp"], made["dp"],
                  made["embed"], made["world"], made["pp_grad"])

