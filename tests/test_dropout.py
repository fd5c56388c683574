"""Dropout under TP and SP (issue 14, item 9): masks per TP rank where the ranks hold different
pieces of an activation, shared where they hold the same, and the loss distribution of the
single-device reference under every layout.

One world of 2 ranks (TP group = the world) runs every check:
  * the sharded stream (rng.tp_sharded) differs across TP ranks, the shared one does not, and
    leaving a region puts the shared stream back in step on every rank;
  * the model's regions: attention-probability dropout (heads) differs across ranks on identical
    inputs; the residual dropouts agree without SP and differ with SP (sequence shards);
  * recomputation (selective, full) redraws the same masks: gradients equal those without it;
  * `--dropout 0.1` under tp2, tp2+SP, pp2 and dp2: the first step's loss over SEEDS seeds has the
    reference's distribution (paired per seed: same weights and data, other masks), dropout
    changes the loss, and a layout's run repeats exactly."""

from __future__ import annotations

import math
from typing import Any

import pytest
from distributed_helper import run_world
from equiv_common import case

SEEDS = 12
DROP = 0.1
LAYOUTS = {"tp2": {"tp": 2}, "tp2_sp": {"tp": 2, "sp": True}, "pp2": {"pp": 2}, "dp2": {"dp": 2}}


def _cfg(seed: int, dropout: float = DROP, **layout: Any) -> dict[str, Any]:
    c = case(layers=2, hidden=32, heads=4, seq_len=16, global_batch=4, steps=1, **layout)
    c["model"]["dropout"] = dropout
    c["train"]["seed"] = seed
    return c


def _gather(t):
    import torch
    import torch.distributed as dist

    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return out


def _same_across_ranks(t) -> bool:
    import torch

    a, b = _gather(t)
    return bool(torch.equal(a, b))


def _mask_checks(group) -> dict[str, Any]:
    import torch

    from par3d import rng
    from par3d.config import ModelConfig
    from par3d.model import MLP, Attention, Block, ModelContext

    out: dict[str, Any] = {}
    cpu = torch.device("cpu")
    torch.manual_seed(5)
    with rng.tp_sharded(group, cpu):
        inside = torch.rand(4096)
    after = torch.rand(4096)
    out["stream_sharded_differs"] = not _same_across_ranks(inside)
    out["stream_shared_after_region"] = _same_across_ranks(after)
    torch.manual_seed(5)
    with rng.tp_sharded(group, cpu, active=False):
        out["stream_inactive_shared"] = _same_across_ranks(torch.rand(4096))

    cfg = ModelConfig(vocab=256, seq_len=16, layers=2, hidden=32, heads=4, dropout=0.5)
    for sp in (False, True):
        ctx = ModelContext(tp=group, seed=0, sequence_parallel=sp)
        attn, mlp = Attention(cfg, ctx, "blocks.0.attn", 2).train(), MLP(cfg, ctx, "blocks.0.mlp", 2).train()
        torch.manual_seed(7)  # the shared stream, as train.py seeds it
        q = k = v = torch.randn(2, attn.local_heads, 16, 8)  # identical inputs on both ranks
        if not sp:
            out["core_differs"] = not _same_across_ranks(attn.core(q, k, v))
        x = torch.ones(2, 16, 32)
        out[f"attn_drop_same_sp{sp}"] = _same_across_ranks(attn.drop(x))
        out[f"mlp_drop_same_sp{sp}"] = _same_across_ranks(mlp.drop(x))
        out[f"stream_in_step_sp{sp}"] = _same_across_ranks(torch.rand(64))

    # recomputation redraws the masks it drew: the same gradients as without it
    grads = {}
    for recompute in ("none", "selective", "full"):
        ctx = ModelContext(tp=group, seed=0, recompute=recompute)
        block = Block(cfg, ctx, 0).train()
        torch.manual_seed(11)
        x = torch.randn(2, 16, 32, requires_grad=True)
        block(x).square().sum().backward()
        grads[recompute] = torch.cat([x.grad.flatten()] + [p.grad.flatten() for p in block.parameters()])
    out["selective_same_grads"] = bool(torch.allclose(grads["selective"], grads["none"], atol=1e-6))
    out["full_same_grads"] = bool(torch.allclose(grads["full"], grads["none"], atol=1e-6))
    return out


def _worker() -> dict[str, Any]:
    import torch.distributed as dist

    from par3d.mesh import Group
    from par3d.train import worker

    r = dist.get_rank()
    out = {"masks": _mask_checks(Group("tp", [0, 1], r, dist.group.WORLD))}
    losses: dict[str, list[float]] = {}
    runs = [("ref", {}), *LAYOUTS.items()]
    for seed in range(SEEDS):
        for name, layout in runs:
            res = worker(_cfg(seed, **layout), {"quiet": True})
            if not res.get("idle"):
                losses.setdefault(name, []).append(res["history"][0]["loss"])
    for name, layout in [("ref_nodrop", {}), ("tp2_again", LAYOUTS["tp2"])]:
        res = worker(_cfg(0, dropout=0.0 if name == "ref_nodrop" else DROP, **layout), {"quiet": True})
        if not res.get("idle"):
            losses[name] = [res["history"][0]["loss"]]
    out["losses"] = losses if r == 0 else {}
    return out


@pytest.fixture(scope="module")
def world() -> list[dict[str, Any]]:
    return run_world(_worker, 2, timeout_s=120)


@pytest.mark.parametrize("check", ["stream_sharded_differs", "stream_shared_after_region", "stream_inactive_shared",
                                   "core_differs", "stream_in_step_spFalse", "stream_in_step_spTrue",
                                   "selective_same_grads", "full_same_grads"])
def test_streams_and_recompute(world, check):
    assert all(r["masks"][check] for r in world), [r["masks"] for r in world]


def test_replicated_regions_share_masks_and_sequence_shards_do_not(world):
    m = world[0]["masks"]
    assert m["attn_drop_same_spFalse"] and m["mlp_drop_same_spFalse"], m  # replicated activations
    assert not m["attn_drop_same_spTrue"] and not m["mlp_drop_same_spTrue"], m  # sequence shards


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_loss_distribution_is_the_references(world, name):
    losses = world[0]["losses"]
    ref, got = losses["ref"], losses[name]
    assert len(ref) == len(got) == SEEDS
    d = [a - b for a, b in zip(got, ref)]
    mean = sum(d) / SEEDS
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (SEEDS - 1))
    # paired per seed (same weights and data): the layout's masks are other draws of the same law
    assert abs(mean) <= 4 * sd / math.sqrt(SEEDS) + 1e-6, (mean, sd, d)
    assert sd > 0, "the masks did not change the loss: is dropout on?"
    spread_ref = max(ref) - min(ref)
    assert max(got) - min(got) <= 2 * spread_ref, (got, ref)


def test_dropout_is_on_and_a_layout_repeats_exactly(world):
    losses = world[0]["losses"]
    assert abs(losses["ref"][0] - losses["ref_nodrop"][0]) > 1e-4
    assert losses["tp2_again"][0] == losses["tp2"][0]
