"""The pruned search (bounds, cached simulations, counted peaks, replayed timelines) returns what an
exhaustive search returns: every configuration of the same space, memory from every rank with the
checker's peaks, time from pipeline/simulate.py itself."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import replace

import pytest
from test_plan_model import live_layers_walked, marks_of

from par3d.pipeline.schedules import build, check
from par3d.pipeline.simulate import simulate
from par3d.plan.cost import (
    DEFAULT_OPTIONS,
    Choice,
    durations_of,
    makespan_lower_bound,
    stage_times,
    straggler_factor,
)
from par3d.plan.dp_tail import dp_tail, optimizer_time
from par3d.plan.hardware import make_cluster
from par3d.plan.memory import rank_memory
from par3d.plan.models import CATALOGUE, ModelSpec
from par3d.plan.search import RECOMPUTE_ORDER, Fixed, Limits, enumerate_choices, replicas, search
from par3d.plan.stage_layout import layout, rank_shapes


def exhaustive(model, cluster, batch, limits):
    cap = DEFAULT_OPTIONS.capacity(cluster)
    rows = []
    for tp, cp, pp, dp, mb, m, sched, v in enumerate_choices(model, cluster, batch, Fixed(), limits, Counter()):
        sp = tp > 1 and (model.seq_len // cp) % tp == 0
        for rec in RECOMPUTE_ORDER:
            for z, r in [(z0, r0) for z0 in range(limits.max_zero_stage + 1)
                         for r0 in replicas(cluster, tp, cp, pp, dp, z0, Fixed())]:
                if z > 0 and dp * cp == 1:
                    continue
                c = Choice(tp, pp, dp, mb, m, sched, v, rec, z, sp, cp, r)
                built = build(sched, pp, m, v)
                peaks = check(built, pp, m, v).peak_inflight
                shapes = rank_shapes(model, tp, pp, v, sched)
                live = None  # interleaved: the built schedule walked chunk by chunk (stage_layout.peak_layers)
                if sched == "interleaved":
                    lay = layout(model, pp * v)
                    live = live_layers_walked(built, pp, list(lay.layers))
                mem = max(rank_memory(model, shape, peaks[k], tp=tp, dp=dp // r, b=mb, sp=sp, recompute=rec,
                                      zero=z, dtype=cluster.dtype, v=v, cp=cp, flash=cluster.flash,
                                      inflight_layers=None if live is None else float(live[k])).total
                          for k, shape in enumerate(shapes))
                if mem > cap:
                    continue
                st = stage_times(model, cluster, c)
                tl = simulate(build(sched, pp, m, v), pp, m, v, durations=durations_of(st, sched),
                              transfer=st.transfer)
                if limits.max_bubble is not None and tl.bubble_wall > limits.max_bubble:
                    continue
                marks = (tl.makespan, marks_of(tl.events, pp * v)) if cluster.hier else None
                k = straggler_factor(cluster.step_spread, c.gpus)  # the slowest GPU's pace (cost.evaluate)
                step = k * (tl.makespan + optimizer_time(model, cluster, c)) + dp_tail(model, cluster, c, st, marks)
                rows.append((step, z, mem, c))
    rows.sort(key=lambda t: t[:3])
    return rows


CASES = [
    ("gpt3-1.3b on 16 A100-40GB", CATALOGUE["gpt3-1.3b"], make_cluster("a100-40gb", 16), 32, Limits()),
    ("13B on 16 A100, max bubble", ModelSpec("13b", 40, 5120, 40, 2048, 51200), make_cluster("a100-80gb", 16), 32,
     Limits(max_bubble=0.2, max_virtual_stages=4)),
    ("llama3-8b at 16K tokens on 16 H100 (cp searched)", replace(CATALOGUE["llama3-8b"], seq_len=16384),
     make_cluster("h100-sxm", 16), 8, Limits(max_virtual_stages=4)),
]


@pytest.mark.parametrize("name,model,cluster,batch,limits", CASES, ids=[c[0] for c in CASES])
def test_pruned_search_returns_the_exhaustive_top_plans(name, model, cluster, batch, limits):
    top = 8
    every = exhaustive(model, cluster, batch, limits)
    ref = every[:top]
    got = search(model, cluster, batch, limits=limits, top=top).plans
    assert ref, "the exhaustive search found nothing: the case tests nothing"
    assert [p.choice for p in got] == [c for *_, c in ref]
    for p, (step, _, mem, _c) in zip(got, ref):
        assert p.step_time == pytest.approx(step, rel=1e-6)
        assert p.memory.total == pytest.approx(mem, rel=1e-9)
    if "cp searched" in name:
        assert any(c.cp > 1 for *_, c in every), "no plan with cp > 1 fits: the case does not test CP"
    if not model.tied:  # the V schedules are in the space (and priced by the same exhaustive rule)
        assert {"zb-v", "dualpipe-v"} <= {c.schedule for *_, c in every}


@pytest.mark.parametrize("name,gpu,gpus,batch,fixed,fsdp", [("gpt3-175b", "a100-40gb", 64, 512, Fixed(), False),
                                                           ("llama3-70b", "h100-sxm", 64, 256, Fixed(), False),
                                                           ("llama3-8b", "h100-sxm", 64, 256, Fixed(recompute_layers=3),
                                                            False),
                                                           ("llama3-8b", "h100-sxm", 64, 256, Fixed(), True)])
def test_shared_stage_times_and_bounds_change_nothing(monkeypatch, name, gpu, gpus, batch, fixed, fsdp):
    """search's _Memo (stage times shared across schedules, memoised bounds, the unfit branch and
    bound, candidates priced only when the simulation order reaches them) returns what the search
    without it does: same plans, same times, same fastest unfit, the same number of simulations and
    the same best plan of each layout (`--explain`)."""
    from par3d.plan import search as S

    def run():
        model, cluster = CATALOGUE[name], replace(make_cluster(gpu, gpus, 8), fsdp=fsdp)  # FSDP: unit cost by stage
        res = S.search(model, cluster, batch, fixed, report_unfit=True, top=8)
        u = res.fastest_unfit
        layouts = [(p.choice, p.step_time) for p in S.best_per_layout(model, cluster, res)]
        return ([(p.choice, p.step_time) for p in res.plans], (u.choice, u.step_time) if u else None,
                res.simulated, res.considered, layouts)

    shared = run()
    assert (shared[0] and len(shared[4]) > 1) or shared[1] is not None  # each case compares something
    orig = S._Memo.__init__

    def off(self, model, cluster):
        orig(self, model, cluster)
        self.on = False

    monkeypatch.setattr(S._Memo, "__init__", off)
    assert run() == shared


@pytest.mark.parametrize("name,gpu,gpus,batch,fixed", [
    ("llama3-8b", "h100-sxm", 64, 256, Fixed(recompute_layers=3)),  # block recomputation
    ("llama3-70b", "h100-sxm", 64, 128, Fixed()),  # CP, ZeRO-3 and the V schedules in the space
    ("gpt3-175b", "a100-80gb", 256, 512, Fixed(zero_stage=3)),
    # a mixture of experts (its bound counts the exposed all-to-alls): leading dense layers, MTP, MLA, EP searched
    ("deepseek-v3", "h100-sxm", 256, 1024, Fixed(pp=8)),
])
def test_the_deferred_bound_never_exceeds_the_full_one(name, gpu, gpus, batch, fixed):
    """The search queues a candidate under its arithmetic bound and prices it in full later; that is exact
    only if the arithmetic bound is never above the full one, for every candidate of the space (a mixture of
    experts' bound with its token exchanges too)."""
    from par3d.plan import search as S

    model, cluster = CATALOGUE[name], make_cluster(gpu, gpus)
    res = S.search(model, cluster, batch, fixed)
    memo = S._Memo(model, cluster)
    items = [t for ts in res.per_layout.values() for t in ts]
    assert len(items) > 100 and res.expand is not None
    for t in items:
        full = res.expand(t) if t[3] is None else t
        assert memo.compute_bound(t[2]) <= full[0], t[2].label()


def test_the_bubble_floor_is_below_the_simulated_bubble_and_sees_stage_imbalance(monkeypatch):
    """--max-bubble rejects a candidate before simulating it when a floor of its bubble is over the limit.  The
    floor must never exceed the simulated bubble (or a plan within the limit is lost); the mean rank's floor sees
    what the busiest rank's misses: a pipeline whose last stage carries a 152K-token vocabulary head beside 3 thin
    layers of 24 idles every other rank for much of the step."""
    from par3d.plan import search as S
    from par3d.plan.cost import Choice, evaluate

    model = ModelSpec("imbalanced", 24, 2048, 16, 4096, 151936, tied=False)
    cluster = make_cluster("h100-sxm", 32)
    gaps = []
    for sched, v, m in [("gpipe", 1, 16), ("1f1b", 1, 16), ("zb-h1", 1, 16), ("interleaved", 2, 16),
                        ("zb-v", 2, 16), ("dualpipe-v", 2, 16)]:
        c = Choice(1, 8, 4, 1, m, sched, v, "none", 1, False)
        # with two chunks a rank the search's cut is also priced against the round-wise one (not "priced here"),
        # and a given cut is priced as given (priced here)
        for mod in (model, replace(model, pipeline_split=(2, 1) * 8)) if v > 1 else (model,):
            st = stage_times(mod, cluster, c)
            plan = evaluate(mod, cluster, c, st=st)
            busiest, mean = S._bubble_floors(st, c)
            floor = S.bubble_floor(mod, cluster, st, c)
            assert busiest <= plan.bubble_fraction + 1e-12 and floor <= plan.bubble_fraction + 1e-12, sched
            if S._priced_here(mod, cluster, c):
                assert floor == max(busiest, mean)
                gaps.append(mean - busiest)
    assert len(gaps) == 6 and max(gaps) > 0.2  # the mean's floor is the tighter, by over 20 points somewhere
    # the search with it returns what the search with the busiest rank's floor alone does, simulating fewer

    def busiest_only(model, cluster, st, c, limit):
        return S._bubble_floors(st, c)[0] > limit

    runs = []
    for patch in (False, True):
        if patch:
            monkeypatch.setattr(S, "over_max_bubble", busiest_only)
        res = S.search(model, cluster, 64, Fixed(dp=2), Limits(max_bubble=0.1), top=3)
        runs.append(([(p.choice, p.step_time) for p in res.plans], res.simulated))
    assert runs[0][0] == runs[1][0] and runs[0][0] and runs[0][1] < runs[1][1]


def test_dp_tail_bound_never_exceeds_the_schedules_tail():
    """The search bounds a configuration before simulating it with `dp_tail` without marks (stage 0's
    buckets alone); the pruned search is exact only if that never exceeds the tail `evaluate` charges
    (the schedule's own bucket timing), over schedules, ZeRO stages and both overlap flags."""
    import itertools

    from par3d.plan.cost import schedule_marks

    checked = 0
    for name in ("gpt3-175b", "llama3-70b"):
        model = CATALOGUE[name]
        for sched, pp, v in (("1f1b", 4, 1), ("interleaved", 4, 2), ("interleaved", 8, 2), ("gpipe", 4, 1),
                             ("zb-h1", 4, 1), ("zb-v", 4, 2), ("dualpipe-v", 4, 2), ("1f1b", 1, 1)):
            for ov, opg, zero, m in itertools.product((True, False), (True, False), (0, 1, 2), (2 * pp, 4 * pp)):
                cl = replace(make_cluster("h100-sxm", 512, 8), overlap_grad_reduce=ov, overlap_param_gather=opg)
                c = Choice(8, pp, 512 // (8 * pp), 1, m, sched, v, "none", zero, True, 1)
                st = stage_times(model, cl, c)
                exact = dp_tail(model, cl, c, st, schedule_marks(st, c))
                assert dp_tail(model, cl, c, st) <= exact * (1 + 1e-9), (name, c, ov, opg)
                checked += 1
    assert checked == 2 * 8 * 24


def test_the_searchs_tail_bound_is_cached_per_backward_kind():
    """1F1B and ZB-H1 share a placement and stage durations, but the tail's bound differs (a split
    schedule's last action need not be stage 0's): the memo keeps one bound for each."""
    from par3d.plan.search import _Memo

    model = CATALOGUE["llama3-70b"]
    cl = make_cluster("h100-sxm", 64, 8)
    memo = _Memo(model, cl)
    one = Choice(8, 4, 2, 1, 8, "1f1b", 1, "none", 1, True)
    zb = replace(one, schedule="zb-h1")
    st = memo.stage_times(one)
    assert memo.stage_times(zb) is st  # shared: the same durations
    b1, bz = memo.bound(one, st), memo.bound(zb, st)
    k = straggler_factor(cl.step_spread, one.gpus)  # stretches the makespan and the optimizer (cost.evaluate)
    for c, b in ((one, b1), (zb, bz)):
        assert b == pytest.approx(k * (makespan_lower_bound(st, c) + optimizer_time(model, cl, c))
                                  + dp_tail(model, cl, c, st))


def test_fsdp_prices_its_units_under_zero_2_and_3_only():
    """`Cluster.fsdp` (PyTorch FSDP): every layer of a stage costs FSDP_UNIT_S per micro-batch under ZeRO-2
    (SHARD_GRAD_OP) and ZeRO-3 (FULL_SHARD), a third in the forward; ZeRO-0 (DDP) and one data-parallel rank
    are untouched; the search leaves out ZeRO-1, which FSDP has not; with pipeline parallelism ZeRO-3's collectives
    run once a step (issue 12's twenty-eighth round)."""
    from par3d.plan.cost import Choice, stage_times
    from par3d.plan.hardware import FSDP_UNIT_S
    from par3d.plan.search import Fixed, Limits, search
    from par3d.plan.stage_layout import layout

    model = CATALOGUE["llama3-8b"]
    # FSDP1 (FlatParameter): the unit cost alone; FSDP2's copy-out is test_fsdp2_copies_each_gathered_layer_out's
    plain, fsdp = make_cluster("h100-sxm", 64, 8), replace(make_cluster("h100-sxm", 64, 8), fsdp=True, fsdp_version=1)
    for z, charged in ((0, False), (2, True)):
        c = Choice(1, 2, 32, 1, 8, "1f1b", 1, "none", z, False)
        a, b = stage_times(model, plain, c), stage_times(model, fsdp, c)
        n = layout(model, 2).layers[0]  # the first stage's layers
        unit = n * FSDP_UNIT_S if charged else 0.0
        assert b.f[0] == pytest.approx(a.f[0] + unit / 3) and b.b[0] == pytest.approx(a.b[0] + 2 * unit / 3), z
    # ZeRO-3 under pipeline parallelism: PyTorch's pipeline stages gather and reduce-scatter a stage once a step (no
    # reshard, no gradient sync between micro-batches), so its per-micro-batch share is 1/m of the plain ZeRO-3's
    from par3d.plan.cp_ep_comm import choice_layer_times
    from par3d.plan.parallel_comm import _zero3_exposed, zero3_layer_collectives

    c = Choice(1, 2, 32, 1, 8, "1f1b", 1, "none", 3, False)
    n = layout(model, 2).layers[0]
    lt = choice_layer_times(model, fsdp, c)
    ag, rs = zero3_layer_collectives(model, fsdp, c, n, 0)
    sig = fsdp.device.sigma
    once = sum(_zero3_exposed(n, lt.fwd, 2 * lt.fwd, ag / 8, rs / 8, sig))
    every = sum(_zero3_exposed(n, lt.fwd, 2 * lt.fwd, ag, rs, sig))
    assert stage_times(model, fsdp, c).zero3[0] == pytest.approx(once + n * FSDP_UNIT_S)
    assert stage_times(model, plain, c).zero3[0] == pytest.approx(every) and once < every
    one = Choice(8, 8, 1, 1, 8, "1f1b", 1, "none", 3, False)  # no data parallelism: nothing to shard
    assert stage_times(model, fsdp, one).f == stage_times(model, plain, one).f
    res = search(model, fsdp, 256, Fixed(tp=1, pp=1, cp=1), Limits(), top=50)
    assert res.plans and {p.choice.zero_stage for p in res.plans} <= {0, 2, 3}


def test_fsdp2_copies_each_gathered_layer_out():
    """FSDP2 (`fsdp_version = 2`, fully_shard) copies every gathered layer out of its flat buffer on the compute stream
    (foreach_all_gather_copy_out): under ZeRO-3 a stage's forward and backward each take n layers x the layer's 16-bit
    weights read and written at HBM rate more than FSDP1's; once a step, on the forward, under pipeline parallelism;
    nothing under ZeRO-2, FSDP1, one data-parallel rank or without --fsdp (issue 12's thirty-seventh round)."""
    from par3d.plan.cost import Choice, stage_times
    from par3d.plan.parallel_comm import fsdp2_copy_out
    from par3d.plan.stage_layout import layout

    model = CATALOGUE["llama3-8b"]
    base = make_cluster("h100-sxm", 64, 8)
    v1, v2 = replace(base, fsdp=True, fsdp_version=1), replace(base, fsdp=True, fsdp_version=2)
    dev = base.device
    flat = Choice(1, 1, 64, 1, 8, "1f1b", 1, "none", 3, False)
    copy = fsdp2_copy_out(model, v2, flat, model.layers, 0)
    assert copy == pytest.approx(4.0 * model.layer_params_per_rank(1) / (dev.mem_bw * dev.mem_eff)) and copy > 0
    a, b = stage_times(model, v1, flat), stage_times(model, v2, flat)
    n = model.layers
    assert b.f[0] == pytest.approx(a.f[0] + n * copy) and b.b[0] == pytest.approx(a.b[0] + n * copy)
    pp2 = Choice(1, 2, 32, 1, 8, "1f1b", 1, "none", 3, False)
    n2 = layout(model, 2).layers[0]
    a, b = stage_times(model, v1, pp2), stage_times(model, v2, pp2)
    assert b.f[0] == pytest.approx(a.f[0] + n2 * copy / pp2.microbatches) and b.b[0] == pytest.approx(a.b[0])
    for cl, c in ((v1, flat), (base, flat), (v2, replace(flat, zero_stage=2)),
                  (v2, Choice(8, 8, 1, 1, 8, "1f1b", 1, "none", 3, False))):
        assert fsdp2_copy_out(model, cl, c, model.layers, 0) == 0.0


def test_block_recomputation_is_the_fewest_layers_that_fit():
    """Where a layout does not fit without recomputation, the search also prices Megatron's block method
    with the fewest layers per chunk that fit (N - 1 would not), and only then: a layout that fits as it
    is gets no block candidate; --recompute fixed or --emit-config's limits leave the block method out."""
    from par3d.plan.cost import DEFAULT_OPTIONS
    from par3d.plan.plan_memory import memory
    from par3d.plan.search import Fixed, Limits, search
    from par3d.plan.stage_layout import layout

    model, cluster = CATALOGUE["llama3-70b"], make_cluster("h100-sxm", 64)
    cap = DEFAULT_OPTIONS.capacity(cluster)
    res = search(model, cluster, 128, Fixed(tp=8, pp=2, cp=1), Limits(), top=200)
    blocks = [p for p in res.plans if p.choice.recompute_layers]
    assert blocks
    for p in blocks:
        c = p.choice
        assert 1 <= c.recompute_layers < max(layout(model, c.pp * c.virtual_stages).layers)
        assert memory(model, cluster, c)[0].total <= cap
        assert memory(model, cluster, replace(c, recompute_layers=c.recompute_layers - 1) if c.recompute_layers > 1
                      else replace(c, recompute="none", recompute_layers=0))[0].total > cap
    fits_bare = {(p.choice.micro_batch, p.choice.schedule, p.choice.virtual_stages, p.choice.zero_stage)
                 for p in res.plans if p.choice.recompute == "none"}
    assert not any((p.choice.micro_batch, p.choice.schedule, p.choice.virtual_stages, p.choice.zero_stage)
                   in fits_bare for p in blocks)
    for fixed, limits in ((Fixed(tp=8, pp=2, cp=1, recompute="full"), Limits()),
                          (Fixed(tp=8, pp=2, cp=1), Limits(block_recompute=False))):
        assert not any(p.choice.recompute_layers for p in search(model, cluster, 128, fixed, limits, top=200).plans)


def test_fsdp_flag_prices_and_explains_its_unit_cost(capsys):
    """`par3d plan --fsdp` turns the unit cost on (a slower step than the same plan without it, by the units
    the busiest rank holds) and `--explain` says how much of dp_comm it is; contradictions are refused."""
    from par3d.cli import main
    from par3d.plan.hardware import FSDP_UNIT_S

    base = ["plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "64", "--global-batch", "64", "--tp", "1",
            "--pp", "1", "--cp", "1", "--micro-batch", "1", "--zero-stage", "3", "--recompute", "full"]
    assert main([*base, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["plans"][0]["step_time_s"]
    assert main([*base, "--fsdp", "--fsdp-version", "1", "--json"]) == 0
    fsdp = json.loads(capsys.readouterr().out)["plans"][0]["step_time_s"]
    assert fsdp - plain == pytest.approx(32 * FSDP_UNIT_S, rel=0.05)  # 32 layers, one micro-batch (+ stragglers)
    assert main([*base, "--fsdp", "--json"]) == 0  # FSDP2 by default: its copy-out on top, twice a layer
    out = json.loads(capsys.readouterr().out)
    assert out["hardware"]["fsdp_version"] == 2
    from par3d.plan.hardware import make_cluster as _mk
    dev = _mk("h100-sxm", 64, 8).device
    copy = 4.0 * CATALOGUE["llama3-8b"].layer_params_per_rank(1) / (dev.mem_bw * dev.mem_eff)
    assert out["plans"][0]["step_time_s"] - fsdp == pytest.approx(2 * 32 * copy, rel=0.05)
    assert main([*base, "--fsdp", "--explain"]) == 0
    text = capsys.readouterr().out
    assert f"32 layers x 1 micro-batches x {FSDP_UNIT_S * 1e3:g} ms" in text and "add --fsdp" not in text
    assert "FSDP2's copy-out" in text
    assert main([*base, "--fsdp-version", "2"]) == 2
    assert "--fsdp-version 2 without --fsdp" in capsys.readouterr().err
    assert main(base) == 0  # a ZeRO-3 plan priced without FSDP's unit cost says how to add it
    assert "add --fsdp" in capsys.readouterr().out
    for extra in (["--zero3-unit", "submodule"], ["--efficiency", "0.5"]):
        assert main([*base, "--fsdp", *extra]) == 2
        assert "--fsdp" in capsys.readouterr().err
    assert main([*base[:-4], "--zero-stage", "1", "--fsdp"]) == 2
    assert "--fsdp with --zero-stage 1" in capsys.readouterr().err


def test_selective_op_recomputation_sits_between_none_and_full():
    """`--recompute op` (torchtitan's selective op checkpointing): stores more than full recomputation and less
    than none, recomputes more than Megatron's selective (the attention core) and less than full; its extra
    FLOPs are the recomputed matmuls' (compute.op_shares); it is priced only when asked and refused where its
    pricing has no place."""
    from par3d.plan.compute import layer_gemms, layer_times, op_shares, recompute_flops_per_sequence
    from par3d.plan.cost import Choice, evaluate
    from par3d.plan.memory import layer_activation_bytes
    from par3d.plan.search import Fixed, Limits, PlanError, search

    model, cluster = CATALOGUE["llama3-8b"], make_cluster("h100-sxm", 64)
    acts = {r: layer_activation_bytes(model, 1, 1, False, r, "bf16", 1, True) for r in ("none", "op", "full")}
    assert acts["full"] < acts["op"] < acts["none"]
    lt = layer_times(model, cluster.device, "bf16", 1, 1, False, True)
    assert lt.core < lt.op_rec < lt.fwd and lt.op_rec > lt.elementwise
    shares = op_shares(model)  # wk of wq/wk/wv, wo, w3 of w1/w3: K is 1/6 of Llama 3 8B's QKV (8 of 32 heads, GQA)
    assert shares == {"qkv": pytest.approx(1 / 6), "attn_out": 1.0, "mlp_in": 0.5}
    fl = {g.name: g.flops for g in layer_gemms(model, 1, 1)}
    gemm = sum(v for k, v in fl.items() if k not in ("attn_scores", "attn_values"))
    op_flops = recompute_flops_per_sequence(model, "op")
    assert op_flops == pytest.approx(model.layers * (fl["qkv"] / 6 + fl["attn_out"] + fl["mlp_in"] / 2))
    assert 0.3 * gemm * model.layers < op_flops < 0.4 * gemm * model.layers
    steps = {r: evaluate(model, cluster, Choice(1, 1, 64, 1, 1, "1f1b", 1, r, 3, False)).step_time
             for r in ("none", "selective", "op", "full")}
    assert steps["none"] < steps["selective"] < steps["op"] < steps["full"]
    assert not any(p.choice.recompute == "op" for p in search(model, cluster, 64, Fixed(tp=1, pp=1), Limits(),
                                                                  top=50).plans)
    for bad in (replace(cluster, zero3_unit="submodule"),):
        with pytest.raises(PlanError, match="--recompute op"):
            search(model, bad, 64, Fixed(recompute="op"), Limits())


def test_selective_op_refusals_through_the_cli(capsys):
    """`--recompute op` is refused, naming the rule, where its pricing has no place: par3d train's config, a
    calibrated host, the block method."""
    from par3d.cli import main

    base = ["plan", "--model", "gpt3-125m", "--gpus", "8", "--global-batch", "64", "--recompute", "op"]
    for extra, says in ((["--gpu", "h100", "--emit-config", "x.toml"], "--recompute op with --emit-config"),
                        (["--hardware", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results",
                                                     "hardware-cpu.json"), "--gpus", "4"], "calibrated host"),
                        (["--gpu", "h100", "--recompute-layers", "2"], "the block method recomputes whole layers")):
        assert main([*base, *extra]) == 2
        assert says in capsys.readouterr().err
    assert main([*base, "--gpu", "h100", "--top", "1"]) == 0
    assert " op " in capsys.readouterr().out


def test_fsdp_under_pipeline_parallelism_keeps_the_stage_gathered():
    """PyTorch's pipeline stages keep an FSDP2 stage's weights gathered and its gradients unreduced between
    micro-batches (issue 12's twenty-eighth round): under --fsdp with PP a ZeRO-3 plan's memory is ZeRO-1's (the
    optimizer's state alone sharded), while without PP, or without --fsdp, ZeRO-3 shards the weights."""
    from par3d.plan.cost import Choice
    from par3d.plan.plan_memory import memory

    model = CATALOGUE["llama3-8b"]
    plain, fsdp = make_cluster("h100-sxm", 64, 8), replace(make_cluster("h100-sxm", 64, 8), fsdp=True)
    pp2 = Choice(1, 2, 32, 1, 8, "1f1b", 1, "none", 3, False)
    z1 = replace(pp2, zero_stage=1)
    assert memory(model, fsdp, pp2)[0] == memory(model, plain, z1)[0]
    assert memory(model, plain, pp2)[0].weights < memory(model, fsdp, pp2)[0].weights
    pp1 = Choice(1, 1, 64, 1, 8, "1f1b", 1, "none", 3, False)
    assert memory(model, fsdp, pp1)[0] == memory(model, plain, pp1)[0]


def test_progress_counts_the_layouts_once_each_and_ends_at_the_total():
    # the callback behind `par3d plan --progress`: told (layouts begun, layouts in all), never backwards, from 0 to
    # the total; the search returns the same plans with or without it
    model, cluster = CATALOGUE["mixtral-8x7b"], make_cluster("h100-sxm", 64)
    seen: list[tuple[int, int]] = []
    with_bar = search(model, cluster, 256, progress=lambda done, total: seen.append((done, total)))
    without = search(model, cluster, 256)
    total = seen[0][1]
    assert total > 1 and all(t == total for _, t in seen)
    assert [d for d, _ in seen] == list(range(total + 1))
    assert [(p.choice, p.step_time) for p in with_bar.plans] == [(p.choice, p.step_time) for p in without.plans]
