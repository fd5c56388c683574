"""`par3d calibrate` and `par3d.predict`: schema, the planner loads the file, fits recover known
parameters, predictions behave.  No timing goals are asserted (the machine may be shared)."""

from __future__ import annotations

import json

import pytest

from par3d.calibrate import fit_collectives, fit_gemm, fit_link, lstsq2
from par3d.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig
from par3d.plan import comm as plan_comm
from par3d.plan.hardware import GB, US, Link, hardware_from_dict, load_hardware_file
from par3d.plan.profile import contention, profile_of
from par3d.predict import predict, predict_step_time


def _hardware_dict() -> dict:
    return {
        "device": {"name": "test-cpu", "peak_tflops": {"fp32": 0.05, "bf16": 0.1}, "mem_bw_gbps": 10.0,
                   "mem_gib": 4.0, "sms": 1, "efficiency": 0.5},
        "gpus_per_node": 4,
        "intra": {"name": "gloo", "alpha_us": 100.0, "bw_gbps": 1.0},
        "inter": {"name": "gloo", "alpha_us": 100.0, "bw_gbps": 1.0},
        "cores": 2,
        "overheads": {"layer_f_s": 3e-4, "layer_b_s": 6e-4, "action_f_s": 2e-4, "action_b_s": 2e-4,
                      "step_s": 2e-3},
        "links": {"p2p": {"alpha_us": 500.0, "bw_gbps": 1.0}},
    }


@pytest.fixture()
def hw_file(tmp_path):
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(_hardware_dict()))
    return str(path)


def _cfg(**kw) -> RunConfig:
    layers = kw.pop("layers", 4)
    hidden = kw.pop("hidden", 64)
    cfg = RunConfig(model=ModelConfig(layers=layers, hidden=hidden, heads=4, seq_len=32),
                    parallel=ParallelConfig(**kw), train=TrainConfig(global_batch=8))
    return cfg.validate()


def test_lstsq_recovers_line():
    rows = [(1.0, x) for x in (1.0, 10.0, 100.0, 1000.0)]
    a, b = lstsq2(rows, [2.0 + 0.5 * x for _, x in rows])
    assert a == pytest.approx(2.0) and b == pytest.approx(0.5)


def test_fit_link_recovers_ring_alpha_beta():
    link = Link("true", 50 * US, 2 * GB)
    pts = [{"kind": "all_reduce", "group": g, "bytes": n, "seconds": plan_comm.all_reduce(n, g, link).total}
           for g in (2, 4) for n in (256, 4096, 65536, 2**20, 2**22)]
    f = fit_link(pts)
    assert f["alpha_us"] == pytest.approx(50, rel=1e-6) and f["bw_gbps"] == pytest.approx(2, rel=1e-6)
    fits = fit_collectives(pts + [{"kind": "p2p", "group": 2, "bytes": n,
                                   "seconds": plan_comm.p2p(n, link).total} for n in (256, 2**20)])
    assert fits["all_reduce"]["4"]["alpha_us"] == pytest.approx(50, rel=1e-6)
    assert fits["p2p"]["2"]["bw_gbps"] == pytest.approx(2, rel=1e-6)


def test_fit_gemm_recovers_overhead_and_rate():
    pts = [{"dtype": "fp32", "flops": f, "seconds": 5e-6 + f / 40e9, "gflops": f / (5e-6 + f / 40e9) / 1e9}
           for f in (1e5, 1e6, 1e7, 1e8, 1e9)]
    fit = fit_gemm(pts)["fp32"]
    assert fit["t0_us"] == pytest.approx(5, rel=1e-3) and fit["rate_gflops"] == pytest.approx(40, rel=1e-3)


def test_hardware_file_loads_in_planner(hw_file):
    hw = load_hardware_file(hw_file)
    assert hw.device.peak("fp32") == pytest.approx(0.05e12)
    assert hw.extra["overheads"]["step_s"] == 2e-3
    prof = profile_of(hw)
    assert prof is not None and prof.cores == 2 and prof.p2p is not None
    assert prof.p2p.alpha == pytest.approx(500 * US)
    # a plain device-and-links file has no runtime profile: the planner's GPU model unchanged
    assert profile_of(load_hardware_file(_plain_file(hw_file))) is None


def test_plan_cli_accepts_calibrated_file(hw_file, capsys):
    from par3d.cli import main

    rc = main(["plan", "--layers", "4", "--hidden", "64", "--heads", "4", "--seq-len", "32", "--vocab", "256",
               "--gpus", "2", "--global-batch", "8", "--dtype", "fp32", "--hardware", hw_file, "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["plans"]


def test_predict_positive_and_monotone(hw_file):
    base = predict_step_time(_cfg(), hw_file)
    assert base > 0
    assert predict_step_time(_cfg(layers=8), hw_file) > base  # more layers, more time
    assert predict_step_time(_cfg(hidden=128), hw_file) > base  # wider, more time
    assert predict_step_time(_cfg(recompute="full"), hw_file) > base  # recompute redoes F
    # gpipe and 1f1b have the same bubble; more micro-batches add fixed per-action costs
    p1 = predict_step_time(_cfg(pp=2, microbatches=2), hw_file)
    assert p1 > 0


def test_predict_does_not_mutate_config(hw_file):
    cfg = _cfg(pp=2, microbatches=4)
    before = cfg.to_dict()
    predict(cfg, load_hardware_file(hw_file))
    assert cfg.to_dict() == before


def test_report_uses_prediction(hw_file):
    from par3d.report import build_report

    cfg = _cfg()
    cfg.hardware = hw_file
    r0 = {"history": [{"loss": 1.0, "step_time_s": 0.1}], "comm_per_step": [], "world": []}
    rep = build_report(cfg, r0)
    assert rep["predicted_step_time_s"] > 0


def test_collective_worker_on_two_ranks():
    """The measuring code runs on a real 2-rank gloo world and its points fit (schema only)."""
    from distributed_helper import run_world

    from par3d.calibrate import collective_worker

    pts = run_world(collective_worker, 2, [256, 4096], True, False, timeout_s=60)[0]
    kinds = {(p["kind"], p["group"]) for p in pts}
    assert kinds == {("all_reduce", 2), ("all_gather", 2), ("reduce_scatter", 2), ("p2p", 2), ("exchange", 2)}
    assert all(p["seconds"] > 0 for p in pts)
    fits = fit_collectives(pts)
    assert fits["pooled_all_reduce"]["alpha_us"] > 0 and fits["pooled_all_reduce"]["bw_gbps"] > 0


def _plain_file(hw_file: str) -> str:
    d = json.loads(open(hw_file).read())
    plain = {k: d[k] for k in ("device", "gpus_per_node", "intra", "inter")}
    path = hw_file + ".plain.json"
    with open(path, "w") as fh:
        json.dump(plain, fh)
    return path


def _hw(tmp_path, **extra):
    path = tmp_path / "hw-extra.json"
    path.write_text(json.dumps({**_hardware_dict(), **extra}))
    return load_hardware_file(str(path))


def _profile(tmp_path, **extra):
    return profile_of(_hw(tmp_path, **extra))


def test_profile_reads_the_calibrated_terms(tmp_path):
    prof = _profile(tmp_path, corun_slowdown=1.2, oversubscribed_slowdown=1.5, collective_sync_us=300.0,
                    pipeline_hop_us=400.0)
    assert (prof.corun, prof.oversub) == (1.2, 1.5)
    assert prof.sync == pytest.approx(300e-6) and prof.hop == pytest.approx(400e-6)
    assert _profile(tmp_path, corun_slowdown=1.2).oversub == 1.2  # older files: oversub = corun


def test_contention_follows_the_busy_ranks(tmp_path):
    prof = _profile(tmp_path, corun_slowdown=1.2, oversubscribed_slowdown=1.5)  # 2 cores
    assert contention(prof, 1) == 1.0
    assert contention(prof, 2) == pytest.approx(1.2)  # every core busy: the co-run slowdown
    assert contention(prof, 4) == pytest.approx(2 * 1.5)  # twice the cores: time-shared and oversubscribed
    assert contention(prof, 2, busy=1.0) == pytest.approx(1.0)  # the partner idle: no co-run cost
    assert contention(prof, 2, busy=1.5) == pytest.approx(1.1)  # half way
    assert contention(prof, 4, busy=3.0) == pytest.approx(1.5 * 1.35)


def test_fixed_costs_have_their_own_corun_slowdown(tmp_path):
    prof = _profile(tmp_path, corun_slowdown=1.2, oversubscribed_slowdown=1.5, corun_fixed_slowdown=2.0,
                    oversubscribed_fixed_slowdown=3.0)
    assert contention(prof, 2, fixed=True) == pytest.approx(2.0)
    assert contention(prof, 4, fixed=True) == pytest.approx(2 * 3.0)
    assert contention(prof, 2) == pytest.approx(1.2)  # the arithmetic's unchanged
    old = _profile(tmp_path, corun_slowdown=1.2, oversubscribed_slowdown=1.5)  # files without them: alike
    assert contention(old, 2, fixed=True) == contention(old, 2) and contention(old, 4, fixed=True) == contention(old, 4)
    # in a prediction: a DP step with more fixed-cost slowdown is slower, by the fixed costs' share only
    cfg = _cfg(dp=2)
    base = predict(cfg, hardware_from_dict({**_hardware_dict(), "corun_slowdown": 1.2})).step_time_s
    more = predict(cfg, hardware_from_dict({**_hardware_dict(), "corun_slowdown": 1.2,
                                            "corun_fixed_slowdown": 2.2})).step_time_s
    assert base < more < base * 2.2 / 1.2


def test_sync_and_hop_add_to_the_prediction(tmp_path):
    tp, pp = _cfg(tp=2), _cfg(pp=2, microbatches=4)
    plain = _hw(tmp_path)
    with_sync = _hw(tmp_path, collective_sync_us=1000.0)
    with_hop = _hw(tmp_path, pipeline_hop_us=1000.0)
    # TP: 2 all-reduces per layer forward and backward (+ embedding and loss): each pays the sync
    assert predict(tp, with_sync).step_time_s - predict(tp, plain).step_time_s > 4 * 4 * 1e-3
    assert predict(pp, with_hop).step_time_s > predict(pp, plain).step_time_s + 2e-3  # >= 2 hops
    assert predict(pp, with_sync).step_time_s < predict(pp, plain).step_time_s + 1e-2  # pp=1 tp: few collectives


def test_waiting_pipeline_ranks_leave_their_cores(tmp_path):
    # 4 pipeline ranks on 2 cores: the bubble leaves cores free, so the stages slow down less than
    # 4 DP ranks (always all busy) do — the model once time-shared every rank all the time
    prof = _profile(tmp_path)
    pipe = predict(_cfg(pp=4, microbatches=4), _hw(tmp_path))
    assert pipe.bubble_fraction > 0.2
    assert contention(prof, 4, busy=4 * (1 - pipe.bubble_fraction)) < contention(prof, 4)


def test_zero_bubble_weight_pass_follows_the_runtime(tmp_path):
    from dataclasses import replace

    from par3d.plan import cost
    from par3d.plan.profile import RUNTIME_BW_FULL_BACKWARD
    from par3d.predict import choice, cluster_of, model_spec

    hw = _hw(tmp_path)
    zb = _cfg(pp=2, microbatches=4, schedule="zb-h1")
    cl = cluster_of(hw, zb)
    # the runtime splits the backward (par3d.weight_grad): BW is the weight GEMMs, not a whole B
    assert RUNTIME_BW_FULL_BACKWARD is False and cl.profile.bw_full_backward is False
    st = cost.stage_times(model_spec(zb), cl, choice(zb))
    assert st.bw[0] < st.b[0]
    # a runtime whose BW re-walked the graph (the field on) pays a whole backward for it
    eager = replace(cl, profile=replace(cl.profile, bw_full_backward=True))
    st = cost.stage_times(model_spec(zb), eager, choice(zb))
    assert st.bw[0] == st.b[0]
    assert predict(zb, hw).step_time_s < cost.evaluate(model_spec(zb), eager, choice(zb)).step_time
    ideal = cost.stage_times(model_spec(zb), replace(cl, profile=None), choice(zb))
    assert ideal.bw[0] < ideal.b[0]  # the planner's GPU model: the weight pass is the weight GEMMs only


def test_collective_sync_fit_recovers_a_known_sync():
    from par3d.calibrate import fit_collective_sync
    from par3d.plan.hardware import hardware_from_dict

    hw = _hardware_dict()
    cfg = _cfg(tp=2)
    measured = predict(cfg, hardware_from_dict({**hw, "collective_sync_us": 500.0})).step_time_s
    assert fit_collective_sync(hw, cfg.to_dict(), measured) == pytest.approx(500e-6, rel=1e-6)
    assert fit_collective_sync(hw, cfg.to_dict(), measured / 10) == 0.0  # faster than α-β alone: no sync


def test_quick_calibration_end_to_end(tmp_path):
    """The whole `calibrate --quick` on 2 ranks: every field the predictor reads is written and sane,
    the host is recorded, and the primitives' fits drive the prediction."""
    from par3d.cli import main

    out = tmp_path / "hw.json"
    assert main(["calibrate", "--quick", "--out", str(out), "--plot", str(tmp_path / "c.png")]) == 0
    hw = json.loads(out.read_text())
    assert hw["corun_slowdown"] >= 1.0 and hw["oversubscribed_slowdown"] >= 1.0
    sync = hw["collective_sync"]  # the sync points with one rank per core and with two
    assert sync["ranks_per_core"] == pytest.approx([1.0, 2.0])
    assert all(x >= 0.0 for x in sync["latency_us"] + sync["skew"]) and hw["pipeline_hop_us"] >= 0.0
    assert {"layers": 2, "hidden": 192, "seq_len": 96} in hw["calibrated"]["references"]
    assert hw["measurements"]["pipeline_hop"]["hops"] > 0
    # one rank running the calibration GPTs: the solo slowdown and the speed check fidelity repeats
    assert 0.5 <= hw["solo_slowdown"] <= 3.0 and len(hw["measurements"]["solo"]["step_s"]) == 3
    speed = hw["speed_check"]["step_s"]  # by world size: one rank, as many as cores, twice as many
    assert set(speed) == {"1", "2", "4"} and all(v > 0 for v in speed.values())
    assert hw["speed_check"]["passes_1"] == [speed["1"]]
    prims = hw["kernels"]["primitives"]
    assert set(prims) == {"linear", "attention", "layer_norm", "gelu", "add", "embedding", "cross_entropy",
                          "ring_block", "merge"}
    assert hw["links"]["cp"]["alpha_us"] > 0 and hw["links"]["cp"]["bw_gbps"] > 0  # the CP ring's exchange
    assert prims["linear"]["forward_rel_rms"] < 0.5  # a GEMM's time is well described by its shape
    assert {"cpu", "cores", "torch", "date"} <= set(hw["host"]) and hw["host"]["cores"] >= 1
    refs = hw["calibrated"]["references"]
    assert {"layers": 4, "hidden": 128, "seq_len": 64} in refs
    file = load_hardware_file(str(out))
    prof = profile_of(file)
    assert prof.cores == hw["cores"] and prof.sync == 0.0  # the per-point model replaces the constant
    assert prof.point_sync.latency_s[0] == pytest.approx(sync["latency_us"][0] * 1e-6)
    assert prof.kernels is not None and prof.kernels.dtype == "fp32"
    assert predict(_cfg(tp=2), file).step_time_s > 0
    assert (tmp_path / "c.png").stat().st_size > 1000


def _kernels(coef: float = 1e-6) -> dict:
    """A kernel table whose every primitive costs `coef` seconds forward and 2·coef backward."""
    from par3d.plan.kernels import FEATURES

    return {"dtype": "fp32", "primitives": {k: {"forward": [coef] + [0.0] * (len(f) - 1),
                                                "backward": [2 * coef] + [0.0] * (len(f) - 1)}
                                            for k, f in FEATURES.items()}}


def test_fit_primitives_recovers_known_coefficients():
    from par3d.calibrate import fit_primitives
    from par3d.plan.kernels import KernelModel, features

    true_f, true_b = (4e-6, 1e-11, 6e-11, 4e-11, 1e-11), (4e-5, 2e-11, 2e-10, 1e-10, 1e-10)
    pts = []
    for m in (32, 128, 512, 2048):
        for n, k in ((96, 32), (128, 128), (512, 128), (128, 512), (1536, 512)):
            x = features("linear", m=m, n=n, k=k)
            pts.append({"kind": "linear", "m": m, "n": n, "k": k,
                        "forward_s": sum(a * b for a, b in zip(true_f, x)),
                        "backward_s": sum(a * b for a, b in zip(true_b, x))})
    table = fit_primitives(pts)
    got = table["primitives"]["linear"]
    assert got["forward"] == pytest.approx(true_f, rel=1e-6) and got["backward"] == pytest.approx(true_b, rel=1e-6)
    # a shape that was not measured is predicted from the fit
    km = KernelModel.from_dict(table)
    x = features("linear", m=1000, n=300, k=96)
    assert km.time("linear", m=1000, n=300, k=96)[0] == pytest.approx(sum(a * b for a, b in zip(true_f, x)))


def test_kernel_block_is_the_sum_of_its_primitives():
    from par3d.plan.kernels import KernelModel

    km = KernelModel.from_dict(_kernels(1e-6))
    blk = km.block(64, 256, 4, 32, 2, 1, False)
    # 4 linears + attention + 2 layer norms + GeLU + 2 residual adds + the heads' merge copy
    assert blk.fwd == pytest.approx(11e-6) and blk.bwd == pytest.approx(22e-6)
    assert blk.core_fwd == pytest.approx(1e-6)
    assert km.head(64, 256, 32, 2, 1, False) == pytest.approx((3e-6, 6e-6))  # norm, GEMM, loss


def test_kernels_replace_the_roofline_in_the_planner(tmp_path):
    """With measured primitives, a layer's arithmetic comes from them (here: a constant per call,
    so the stage's compute is independent of the width)."""
    from par3d.plan import cost
    from par3d.predict import choice, cluster_of, model_spec

    hw = _hw(tmp_path, kernels=_kernels(1e-6))
    narrow, wide = _cfg(hidden=64), _cfg(hidden=256)
    st_n = cost.stage_times(model_spec(narrow), cluster_of(hw, narrow), choice(narrow))
    st_w = cost.stage_times(model_spec(wide), cluster_of(hw, wide), choice(wide))
    # 4 blocks of 11 primitives + embedding (lookup + add) + head (3): forward 49 µs per micro-batch
    assert st_n.f_compute[0] == pytest.approx(49e-6) and st_w.f_compute[0] == pytest.approx(49e-6)
    assert st_n.b_compute[0] == pytest.approx(98e-6)


def test_ring_attention_is_the_sum_of_its_pieces():
    """Context parallelism's attention on one CP rank from the ring's measured pieces (a constant
    per call: 1 µs forward, 2 µs backward), counted by hand from context_parallel.py."""
    from par3d.plan.kernels import KernelModel

    km = KernelModel.from_dict(_kernels(1e-6))
    # forward: own block + its mask + (cp-1) x (remote block + merge) + the K/V stack
    # backward: D + K/V stack + own block + mask + dQ, dK, dV adds + (cp-1) x (block + 3 adds)
    for cp in (2, 4):
        fwd, bwd = km.ring_attention(8, 32, 16, cp)
        assert fwd == pytest.approx((3 + 2 * (cp - 1)) * 1e-6)
        assert bwd == pytest.approx((1 + 1 + 2 + 1 + 3 + 5 * (cp - 1)) * 1e-6)
    blk1, blk2 = km.block(64, 256, 4, 32, 2, 1, False), km.block(64, 256, 4, 16, 2, 1, False, cp=2)
    assert blk2.fwd - blk1.fwd == pytest.approx(km.ring_attention(8, 16, 16, 2)[0] - 1e-6)
    # a file from before the ring's probes: cp causal attentions of the local tokens
    old = KernelModel(km.dtype, tuple(f for f in km.fits if f[0] not in ("ring_block", "merge")))
    assert old.ring_attention(8, 32, 16, 2) == pytest.approx((2e-6, 4e-6))


def _collective_fits(alpha_us: float, bw_gbps: float) -> dict:
    return {k: {"2": {"alpha_us": alpha_us, "bw_gbps": bw_gbps}} for k in ("all_reduce", "all_gather",
                                                                            "reduce_scatter")}


def test_context_parallel_pays_every_ring_exchange(tmp_path):
    """cp = 2 on a calibrated host: the ring's arithmetic from its pieces, and per layer one K/V
    exchange forward and three backward (K/V once more, two dK/dV accumulators), each the measured
    exchange plus the in-step sync, none hidden."""
    from par3d.plan import cost
    from par3d.predict import choice, cluster_of, model_spec

    hw = _hw(tmp_path, kernels=_kernels(1e-6), collective_sync_us=100.0,
             links={"p2p": {"alpha_us": 5.0, "bw_gbps": 1.0}, "cp": {"alpha_us": 200.0, "bw_gbps": 2.0}})
    cfg = _cfg(cp=2)
    st = cost.stage_times(model_spec(cfg), cluster_of(hw, cfg), choice(cfg))
    b = cfg.train.global_batch  # one micro-batch: every sequence
    kv = b * 16 * 2 * 64 * 4  # s/cp tokens x (K, V) x h x fp32
    hop = 200e-6 + 100e-6 + kv / 2e9
    assert st.waits["f"][0] == pytest.approx(4 * hop)  # 4 layers
    assert st.waits["b"][0] == pytest.approx(4 * 3 * hop)
    assert st.f_compute[0] > 4 * 3e-6  # the ring's pieces, not the roofline (whose 4 µs / layer ...)


def test_zero3_pays_each_units_gathers_and_reduce_scatters(tmp_path):
    """dp = 2, ZeRO-3 on a calibrated host: every unit (the embedding, 4 blocks, the head) gathered
    before its forward and its backward, reduce-scattered after it, each at the isolated calls'
    measured α-β; with tied embeddings the shared table stays resident and is reduced on its own."""
    from dataclasses import replace

    from par3d.plan import cost
    from par3d.plan.models import ModelSpec
    from par3d.predict import choice, cluster_of, model_spec

    hw = _hw(tmp_path, kernels=_kernels(1e-6), collective_fits=_collective_fits(500.0, 1.0))
    cfg = _cfg(dp=2, zero_stage=3)
    spec: ModelSpec = model_spec(cfg)
    st = cost.stage_times(spec, cluster_of(hw, cfg), choice(cfg))
    table = spec.vocab * 64
    units = [spec.layer_params_per_rank(1)] * 4 + [32 * 64 + table, spec.norm_params + table]

    def call(nbytes: float) -> float:  # a 2-rank gather or reduce-scatter: α + n/2 / β
        return 500e-6 + nbytes / 2 / 1e9

    ag = sum(call(4 * u) for u in units)
    assert st.waits["f"][0] == pytest.approx(ag)
    assert st.waits["b"][0] == pytest.approx(2 * ag)  # the reduce-scatters: the same bytes and fit
    tied = replace(spec, tied=True)
    st = cost.stage_times(tied, cluster_of(hw, cfg), choice(cfg))
    units = [spec.layer_params_per_rank(1)] * 4 + [32 * 64, spec.norm_params]
    ag = sum(call(4 * u) for u in units)
    assert st.waits["f"][0] == pytest.approx(ag)
    assert st.waits["b"][0] == pytest.approx(2 * ag + call(4 * table))
    # ZeRO-1 keeps its one reduction after the backward: no per-unit calls inside the actions
    z1 = _cfg(dp=2, zero_stage=1)
    assert cost.stage_times(spec, cluster_of(hw, z1), choice(z1)).waits["f"][0] == pytest.approx(0.0)


def test_residual_overheads_take_out_the_primitives():
    from par3d.calibrate import residual_overheads

    measured = {"layer_f_s": 300e-6, "layer_b_s": 400e-6, "action_f_s": 200e-6, "action_b_s": 100e-6,
                "step_s": 1e-3}
    tiny = {"hidden": 16, "heads": 2, "seq": 8, "micro_batch": 1, "vocab": 256}
    got = residual_overheads(measured, _kernels(10e-6), tiny)
    assert got["layer_f_s"] == pytest.approx(300e-6 - 110e-6)
    assert got["layer_b_s"] == pytest.approx(400e-6 - 220e-6)
    assert got["action_f_s"] == pytest.approx(200e-6 - 50e-6)  # embedding 2, head 3 primitives
    assert got["action_b_s"] == 0.0  # never below zero
    assert got["step_s"] == 1e-3


def test_contention_fit_recovers_a_known_slowdown():
    from par3d.calibrate import fit_contention
    from par3d.plan.hardware import hardware_from_dict

    hw = _hardware_dict()
    cfg = _cfg(dp=2)
    measured = predict(cfg, hardware_from_dict({**hw, "corun_slowdown": 1.3})).step_time_s
    assert fit_contention(hw, cfg.to_dict(), measured, "corun_slowdown") == pytest.approx(1.3, rel=1e-6)
    assert fit_contention(hw, cfg.to_dict(), measured / 2, "corun_slowdown") == 1.0  # never below 1


def test_corun_fit_recovers_known_slowdowns_of_arithmetic_and_fixed_costs():
    from par3d.calibrate.fits import fit_corun
    from par3d.plan.hardware import hardware_from_dict

    hw = _hardware_dict()
    # three GPTs from fixed-cost-heavy to arithmetic-heavy, DP over the 2 cores
    cfgs = [_cfg(dp=2, layers=6, hidden=16), _cfg(dp=2), _cfg(dp=2, layers=2, hidden=192)]
    truth = {"corun_slowdown": 1.3, "corun_fixed_slowdown": 2.1}
    runs = [(c.to_dict(), predict(c, hardware_from_dict({**hw, **truth})).step_time_s) for c in cfgs]
    x, y = fit_corun(hw, runs, "corun_slowdown", "corun_fixed_slowdown")
    assert (x, y) == (pytest.approx(1.3, rel=1e-6), pytest.approx(2.1, rel=1e-6))
    # measured faster than the model allows: both at the lower bound, never below 1
    fast = [(c, t / 3) for c, t in runs]
    assert fit_corun(hw, fast, "corun_slowdown", "corun_fixed_slowdown") == (1.0, 1.0)


def test_host_is_recorded_and_another_host_warned_in_one_line(hw_file, tmp_path, capsys):
    from par3d import host
    from par3d.cli import main

    here = host.describe()
    assert host.mismatch(here) == [] and host.mismatch(None) == []
    other = {**here, "cpu": "Some Other CPU", "cores": here["cores"] + 6}
    assert len(host.mismatch(other)) == 2
    d = {**_hardware_dict(), "host": other}
    path = tmp_path / "other.json"
    path.write_text(json.dumps(d))
    rc = main(["plan", "--layers", "4", "--hidden", "64", "--heads", "4", "--seq-len", "32", "--vocab", "256",
               "--gpus", "2", "--global-batch", "8", "--dtype", "fp32", "--hardware", str(path), "--json"])
    assert rc == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(err) == 1 and "another host" in err[0] and "Some Other CPU" in err[0]
    # this host's file: no warning
    path.write_text(json.dumps({**_hardware_dict(), "host": here}))
    assert main(["plan", "--layers", "4", "--hidden", "64", "--heads", "4", "--seq-len", "32", "--vocab", "256",
                 "--gpus", "2", "--global-batch", "8", "--dtype", "fp32", "--hardware", str(path), "--json"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_outputs_default_under_runs():
    """`calibrate` and every `bench` write under runs/ unless --out is given (the committed results
    under benchmarks/results/ change only when named)."""
    from par3d.cli import build_parser
    from par3d.commands.bench import BENCHES

    ap = build_parser()
    outs = {"calibrate": ap.parse_args(["calibrate"]).out}
    for b in BENCHES:
        outs[b] = ap.parse_args(["bench", b]).out
    for name, out in outs.items():
        assert out.startswith("runs"), (name, out)
        assert "benchmarks" not in out, (name, out)


@pytest.mark.parametrize("layout", [
    dict(tp=1, pp=2, dp=1, schedule="1f1b", micro_batch=1, recompute="none"),
    dict(tp=2, pp=1, dp=1, schedule="1f1b", micro_batch=2, recompute="full"),
    dict(tp=1, pp=2, dp=2, schedule="zb-h1", micro_batch=1, recompute="none"),
    dict(tp=1, pp=1, dp=2, schedule="1f1b", micro_batch=4, recompute="none"),
])
def test_plan_and_report_predict_the_same_step_time(hw_file, capsys, layout):
    """One step-time model: `par3d plan --hardware FILE` with the layout fixed, and the end-of-run
    report of `par3d train --hardware FILE` on that layout, give the same number."""
    from par3d.cli import main
    from par3d.report import build_report, format_report

    lay = dict(layout)
    mb = lay.pop("micro_batch")
    gb = 8
    world = lay["tp"] * lay["pp"] * lay["dp"]
    rc = main(["plan", "--layers", "4", "--hidden", "64", "--heads", "4", "--seq-len", "32", "--vocab", "256",
               "--gpus", str(world), "--global-batch", str(gb), "--dtype", "fp32", "--hardware", hw_file,
               "--tp", str(lay["tp"]), "--pp", str(lay["pp"]), "--dp", str(lay["dp"]), "--micro-batch", str(mb),
               "--schedule", lay["schedule"], "--recompute", lay["recompute"], "--zero-stage", "0",
               "--virtual-stages", "1", "--json"])
    assert rc == 0
    planned = json.loads(capsys.readouterr().out)["plans"][0]
    assert (planned["tp"], planned["pp"], planned["dp"], planned["micro_batch"]) == \
        (lay["tp"], lay["pp"], lay["dp"], mb)
    # the same model (plan's custom shapes tie the embeddings) and layout (plan turns SP on with tp > 1)
    cfg = RunConfig(model=ModelConfig(layers=4, hidden=64, heads=4, seq_len=32, vocab=256, tied_embeddings=True),
                    parallel=ParallelConfig(tp=lay["tp"], pp=lay["pp"], dp=lay["dp"], schedule=lay["schedule"],
                                            recompute=lay["recompute"], microbatches=gb // (mb * lay["dp"]),
                                            sequence_parallel=planned["sequence_parallel"]),
                    train=TrainConfig(global_batch=gb, micro_batch=mb, dtype="fp32"), hardware=hw_file).validate()
    rep = build_report(cfg, {"history": [{"loss": 1.0, "step_time_s": 0.1}], "comm_per_step": [], "world": []})
    assert rep["predicted_step_time_s"] == pytest.approx(planned["step_time_s"], rel=1e-9)
    # and the report prints it as plan does (ms, one decimal)
    assert f"{planned['step_time_s'] * 1e3:.1f} ms" in format_report(rep)


def test_calibrate_imports_nothing_from_bench():
    """calibrate is split into probes, fits, run and report, and none of them reaches up into bench/."""
    import subprocess
    import sys

    code = ("import sys, par3d.calibrate, par3d.calibrate.probes, par3d.calibrate.fits, par3d.calibrate.run, "
            "par3d.calibrate.report, par3d.commands.calibrate; "
            "print([m for m in sys.modules if m.startswith('par3d.bench')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---- the in-step cost of TP / CP synchronisation points (plan/profile.py's SyncModel) -------------

def _sync(lat_us: list[float], skew: list[float], rpc: tuple[float, ...] = (1.0, 2.0)) -> dict:
    return {"collective_sync": {"ranks_per_core": list(rpc), "latency_us": lat_us, "skew": skew}}


def test_sync_model_reads_its_load_and_rejects_a_bad_table(tmp_path):
    from par3d.plan.profile import SyncModel

    prof = _profile(tmp_path, collective_sync_us=300.0, **_sync([100.0, 300.0], [0.1, 0.5]))
    sm = prof.point_sync
    assert prof.sync == 0.0  # the per-point model replaces the older constant per message step
    assert sm.at(0.5) == pytest.approx((100e-6, 0.1))  # flat outside the measured loads
    assert sm.at(1.5) == pytest.approx((200e-6, 0.3))  # linear in between
    assert sm.at(4.0) == pytest.approx((300e-6, 0.5))
    with pytest.raises(ValueError, match="ranks_per_core"):
        SyncModel.from_dict({"ranks_per_core": [2.0, 1.0], "latency_us": [1.0, 2.0], "skew": [0.0, 0.0]})
    with pytest.raises(ValueError, match="one length"):
        SyncModel.from_dict({"ranks_per_core": [1.0], "latency_us": [1.0, 2.0], "skew": [0.0]})


def test_sync_points_follow_the_runtime():
    from par3d.plan import cost

    tp = cost.Choice(tp=2, pp=1, dp=1, micro_batch=1, microbatches=1)
    assert cost.sync_points(tp, 4, True, True) == (2 * 4 + 1 + 3, 2 * 4, 0, 0)
    full = cost.Choice(tp=2, pp=1, dp=1, micro_batch=1, microbatches=1, recompute="full")
    assert cost.sync_points(full, 4, False, False) == (8, 16, 0, 0)  # the recomputed forward meets again
    cp = cost.Choice(tp=1, pp=1, dp=1, micro_batch=1, microbatches=1, cp=2)
    assert cost.sync_points(cp, 4, True, True) == (0, 0, 4, 12)  # K/V forward; K/V and dK/dV backward
    dp = cost.Choice(tp=1, pp=1, dp=2, micro_batch=1, microbatches=1)
    assert cost.sync_points(dp, 4, True, True) == (0, 0, 0, 0)  # DP meets once, after the backward


def test_sync_latency_is_paid_per_point_and_skew_per_compute(tmp_path):
    """With one rank per core (TP 2 on 2 cores) each point costs the latency; the skew adds in
    proportion to the CPU work; layouts without TP or CP pay nothing."""
    tp, dp = _cfg(tp=2), _cfg(dp=2)
    plain = predict(tp, _hw(tmp_path)).step_time_s
    lat = predict(tp, _hw(tmp_path, **_sync([1000.0, 1000.0], [0.0, 0.0]))).step_time_s
    points = 4 * 4 + 1 + 3  # 4 blocks x 2 each way, the embedding's, the loss's 3
    assert lat - plain >= points * 1e-3 * 0.999
    lo = predict(tp, _hw(tmp_path, **_sync([0.0, 0.0], [0.1, 0.1]))).step_time_s
    hi = predict(tp, _hw(tmp_path, **_sync([0.0, 0.0], [0.2, 0.2]))).step_time_s
    assert hi - lo == pytest.approx(lo - plain, rel=0.2) and lo > plain
    assert predict(dp, _hw(tmp_path, **_sync([1000.0, 1000.0], [0.5, 0.5]))).step_time_s == \
        pytest.approx(predict(dp, _hw(tmp_path)).step_time_s)


def test_sync_is_read_at_the_layouts_ranks_per_core(tmp_path):
    """TP 2 alone on 2 cores reads the one-rank-per-core entry; beside a second pair (DP 2, 4 ranks)
    the two-ranks-per-core one, whose wait is time-shared: it costs more than the latency."""
    from par3d.calibrate.fits import sync_load
    from par3d.plan.hardware import hardware_from_dict

    only_crowded = _hw(tmp_path, **_sync([0.0, 1000.0], [0.0, 0.0]))
    tp, tpdp = _cfg(tp=2), _cfg(tp=2, dp=2)
    assert predict(tp, only_crowded).step_time_s == pytest.approx(predict(tp, _hw(tmp_path)).step_time_s)
    extra = predict(tpdp, only_crowded).step_time_s - predict(tpdp, _hw(tmp_path)).step_time_s
    assert extra > (4 * 4 + 4) * 1e-3  # every point at the latency, and time-shared beyond it
    hw = _hardware_dict()
    assert sync_load(hw, tp.to_dict()) == pytest.approx(1.0)
    assert sync_load(hw, tpdp.to_dict()) == pytest.approx(2.0)
    pipe = sync_load(hw, _cfg(tp=2, pp=2, microbatches=4).to_dict())
    assert 1.0 < pipe < 2.0  # the pipeline bubble: fewer ranks inside an action
    assert hardware_from_dict(hw) is not None


def test_point_sync_fit_recovers_known_latency_and_skew():
    from par3d.calibrate import fit_point_sync
    from par3d.calibrate.probes import sync_configs
    from par3d.plan.hardware import hardware_from_dict

    hw = _hardware_dict()
    for tp, dp, lat, skew in ((2, 1, 800.0, 0.3), (2, 2, 1200.0, 0.6)):
        cfgs = sync_configs(3, tp, dp)
        true = hardware_from_dict({**hw, **_sync([lat], [skew], (float(dp),))})
        runs = [(c, predict(RunConfig.from_dict(c), true).step_time_s) for c in cfgs]
        got = fit_point_sync(hw, runs)
        assert got["ranks_per_core"] == pytest.approx(float(dp))
        assert got["latency_us"] == pytest.approx(lat, rel=1e-2) and got["skew"] == pytest.approx(skew, rel=1e-2)
    # runs faster than the model without sync: no negative terms
    runs = [(c, 0.5 * predict(RunConfig.from_dict(c), hardware_from_dict(hw)).step_time_s) for c in sync_configs(3, 2, 1)]
    got = fit_point_sync(hw, runs)
    assert got["latency_us"] == 0.0 and got["skew"] == 0.0


def test_zero1_and_zero2_pay_their_calls_at_the_measured_kinds(tmp_path):
    """On a calibrated host ZeRO-1 reduce-scatters its size-filled buckets once, ZeRO-2 one bucket
    per unit every micro-batch, each at its kind's measured α-β (not the all-reduce's)."""
    fits = {kind: {"2": {"alpha_us": a, "bw_gbps": 1.0}}
            for kind, a in (("all_reduce", 100.0), ("all_gather", 2000.0), ("reduce_scatter", 3000.0))}
    hw = _hw(tmp_path, collective_fits=fits)
    z1, z2 = _cfg(dp=2, zero_stage=1), _cfg(dp=2, zero_stage=2, microbatches=2)
    base = predict(_cfg(dp=2, zero_stage=1), _hw(tmp_path)).breakdown["dp_comm"]
    d1 = predict(z1, hw).breakdown["dp_comm"]
    assert d1 >= 3000e-6 + 2000e-6 and d1 > base  # at least one reduce-scatter and one gather call
    d2 = predict(z2, hw).breakdown["dp_comm"]
    units = 4 + 2  # the blocks, the embedding, the head
    assert d2 >= 2 * units * 3000e-6 + units * 2000e-6  # every micro-batch's unit reductions, one gather each


def test_solo_slowdown_scales_the_primitives_and_its_fit_recovers_it(tmp_path):
    """`solo_slowdown` multiplies the arithmetic priced from the primitives (not the fixed costs);
    the calibration's fit on a one-rank run recovers a known value, below 1 too."""
    from par3d.calibrate import fit_contention
    from par3d.plan import cost
    from par3d.plan.hardware import hardware_from_dict
    from par3d.predict import choice, cluster_of, model_spec

    cfg = _cfg()
    base = _hw(tmp_path, kernels=_kernels(1e-6))
    slow = _hw(tmp_path, kernels=_kernels(1e-6), solo_slowdown=1.5)
    st0 = cost.stage_times(model_spec(cfg), cluster_of(base, cfg), choice(cfg))
    st1 = cost.stage_times(model_spec(cfg), cluster_of(slow, cfg), choice(cfg))
    assert st1.f_compute[0] == pytest.approx(1.5 * st0.f_compute[0])
    assert st1.b_compute[0] == pytest.approx(1.5 * st0.b_compute[0])
    # the fixed costs are not scaled: f - f_compute is the same
    assert st1.f[0] - st1.f_compute[0] == pytest.approx(st0.f[0] - st0.f_compute[0])
    hw = {**_hardware_dict(), "kernels": _kernels(1e-5)}
    for k in (0.8, 1.25):
        measured = predict(cfg, hardware_from_dict({**hw, "solo_slowdown": k})).step_time_s
        assert fit_contention(hw, cfg.to_dict(), measured, "solo_slowdown", lo=0.5, hi=3.0) == pytest.approx(k, rel=1e-6)


def test_calibrate_refuses_a_negative_hold(capsys):
    """--sustained-s below 0 is refused before anything is measured, naming the flag and a fix."""
    from par3d.cli import main

    assert main(["calibrate", "--sustained-s", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--sustained-s -1" in err and "--sustained-s 60" in err


def test_a_gpu_files_fixed_costs_overlap_its_kernels(tmp_path):
    """A GPU runs kernels while the host issues the next ones, so a GPU file's per-block fixed costs (what
    `par3d calibrate` measures on a tiny GPT) count only where they exceed the GPU's work.  Found on the second
    H200 lease: added to the arithmetic they put every run 20-70 % slow (docs/measured.md §6)."""
    from dataclasses import replace

    from par3d.plan import cost
    from par3d.predict import choice, cluster_of, model_spec

    cfg = _cfg(pp=2, microbatches=4)
    sync_cl = cluster_of(_hw(tmp_path), cfg)
    gpu_cl = replace(sync_cl, profile=replace(sync_cl.profile, asynchronous=True))
    assert profile_of(_hw(tmp_path, host={"gpu": "NVIDIA H200"})).asynchronous
    assert not profile_of(_hw(tmp_path, host={"gpu": None})).asynchronous
    m, c = model_spec(cfg), choice(cfg)
    ideal = cost.stage_times(m, replace(sync_cl, profile=None), c)
    on_cpu, on_gpu = cost.stage_times(m, sync_cl, c), cost.stage_times(m, gpu_cl, c)
    for s in range(2):
        fx_f, fx_b = on_cpu.fixed_f[s], on_cpu.fixed_b[s]
        assert on_cpu.f[s] == pytest.approx(on_cpu.f_compute[s] + fx_f)  # a CPU pays both
        # the GPU: the longer of the two
        assert on_gpu.f[s] == pytest.approx(max(on_gpu.f_compute[s], fx_f))
        assert on_gpu.b[s] == pytest.approx(max(on_gpu.b_compute[s] + on_gpu.b_recompute[s], fx_b))
        assert on_gpu.f[s] < on_cpu.f[s] and on_gpu.b[s] < on_cpu.b[s]
    # fixed costs far below the GPU's work vanish: the GPU model's own stage times
    tiny = replace(gpu_cl, profile=replace(gpu_cl.profile, overheads=replace(
        gpu_cl.profile.overheads, layer_f_s=1e-12, layer_b_s=1e-12, action_f_s=1e-12, action_b_s=1e-12)))
    quiet = cost.stage_times(m, tiny, c)
    assert quiet.f == pytest.approx(ideal.f) and quiet.b == pytest.approx(ideal.b)
