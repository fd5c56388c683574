"""Rank arithmetic: TP fastest, then CP, then PP, then DP (seed 2.5) — no processes needed."""

from __future__ import annotations

import itertools

import pytest

from par3d.mesh import Mesh


def test_tp_is_innermost_then_pp_then_dp():
    m = Mesh(dp=2, pp=2, tp=2)
    assert [(c.dp, c.pp, c.tp) for c in map(m.coord, range(8))] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]


def test_cp_sits_between_tp_and_pp():
    """rank = ((dp·pp + pp_rank)·cp + cp_rank)·tp + tp_rank (DESIGN.md idea 3)."""
    m = Mesh(dp=2, pp=2, tp=2, cp=2)
    assert [(c.dp, c.pp, c.cp, c.tp) for c in map(m.coord, range(16))] == [
        (d, p, k, t) for d in range(2) for p in range(2) for k in range(2) for t in range(2)]
    assert m.cp_group(5) == [5, 7]
    assert m.tp_group(5) == [4, 5]
    assert m.pp_group(5) == [1, 5]
    assert m.dp_group(5) == [5, 13]
    assert m.dpcp_group(5) == [5, 7, 13, 15]  # the ranks holding rank 5's parameters
    assert m.embed_group(5) == [1, 5]
    assert m.pp_rank_to_global(5, 0) == 1


@pytest.mark.parametrize("dp,pp,cp,tp", [(2, 2, 2, 1), (1, 3, 2, 2), (2, 1, 4, 1), (3, 2, 3, 2)])
def test_groups_with_cp_partition_the_world(dp, pp, cp, tp):
    m = Mesh(dp, pp, tp, cp)
    for r in range(m.world_size):
        c = m.coord(r)
        assert m.rank(c.dp, c.pp, c.tp, c.cp) == r
    for kind, size in (("tp", tp), ("cp", cp), ("pp", pp), ("dp", dp), ("dpcp", dp * cp)):
        groups = m.all_groups(kind)
        assert all(len(g) == size for g in groups)
        assert sorted(itertools.chain.from_iterable(groups)) == list(range(m.world_size)), kind


@pytest.mark.parametrize("dp,pp,tp", [(1, 1, 1), (2, 3, 4), (4, 2, 1), (1, 4, 2), (3, 1, 5)])
def test_rank_coord_round_trip_and_groups_partition_the_world(dp, pp, tp):
    m = Mesh(dp, pp, tp)
    for r in range(m.world_size):
        c = m.coord(r)
        assert m.rank(c.dp, c.pp, c.tp) == r
    for kind, size in (("tp", tp), ("pp", pp), ("dp", dp)):
        groups = m.all_groups(kind)
        assert all(len(g) == size for g in groups)
        flat = sorted(itertools.chain.from_iterable(groups))
        assert flat == list(range(m.world_size)), f"{kind} groups must partition the ranks"


def test_tp_groups_are_consecutive_ranks():
    m = Mesh(2, 2, 4)
    for g in m.all_groups("tp"):
        assert g == list(range(g[0], g[0] + 4))


def test_pipeline_neighbours_and_embedding_group():
    m = Mesh(2, 4, 2)
    r = m.rank(1, 2, 1)
    prev_r, next_r = m.stage_neighbours(r)
    assert m.coord(prev_r).pp == 1 and m.coord(next_r).pp == 3
    assert m.coord(prev_r).dp == 1 and m.coord(prev_r).tp == 1
    assert m.stage_neighbours(m.rank(0, 0, 0))[0] is None
    assert m.embed_group(m.rank(0, 0, 1)) == [m.rank(0, 0, 1), m.rank(0, 3, 1)]
    assert m.pp_rank_to_global(r, 0) == m.rank(1, 0, 1)


def test_bad_mesh_and_coordinates():
    with pytest.raises(ValueError):
        Mesh(0, 1, 1)
    with pytest.raises(ValueError):
        Mesh(1, 1, 2).coord(2)
    with pytest.raises(ValueError):
        Mesh(1, 1, 2).rank(0, 1, 0)
