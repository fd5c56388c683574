"""Pipeline parallelism against the single-process reference (issues 4 and 17).

Every schedule x pp in {2, 4} x m in {p, 2p} (interleaved, zb-v and dualpipe-v with v = 2;
dualpipe-v needs m >= 2p, so it runs m in {2p, 4p}), alone and combined with TP = 2 and DP = 2,
in ONE world of 8 gloo ranks: losses of 3 steps, step-1 gradients and the
parameters after step 3 equal the one-process run within TOL = 1e-5 (fp32).  Also: tied
embeddings across stages and on the V schedules' rank 0, recomputation, sequence parallelism inside stages, and activation
memory that follows the schedule."""

from __future__ import annotations

import pytest
from distributed_helper import run_world
from equiv_common import (
    TOL,
    assert_matches_reference,
    case,
    losses,
    reference_of,
    run_cases,
)

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-v", 2), ("dualpipe-v", 2)]
LAYOUTS: dict[str, dict] = {}
for sched, v in SCHEDULES:
    k = 2 if sched == "dualpipe-v" else 1  # dualpipe-v: m >= 2p
    for pp in (2, 4):
        for m in (k * pp, 2 * k * pp):
            LAYOUTS[f"{sched}_pp{pp}_m{m}"] = case(pp=pp, schedule=sched, m=m, v=v)
        # combined with TP=2 and with DP=2 (m = p keeps the world at <= 8 ranks)
        LAYOUTS[f"{sched}_pp{pp}_m{k * pp}_tp2"] = case(pp=pp, tp=2, schedule=sched, m=k * pp, v=v)
        LAYOUTS[f"{sched}_pp{pp}_m{2 * pp}_dp2"] = case(pp=pp, dp=2, schedule=sched, m=2 * pp, v=v)
    LAYOUTS[f"{sched}_dp2_pp2_tp2"] = case(dp=2, pp=2, tp=2, schedule=sched, m=4, v=v)
LAYOUTS.update({
    "1f1b_pp2_tied": case(pp=2, tied=True),
    "interleaved_pp2_tied_tp2": case(pp=2, tp=2, schedule="interleaved", v=2, m=4, tied=True),
    "1f1b_pp2_recompute_full": case(pp=2, recompute="full"),
    "1f1b_pp2_recompute_selective": case(pp=2, recompute="selective"),
    "1f1b_pp2_tp2_sp": case(pp=2, tp=2, sp=True),
    "1f1b_pp2_dp2_zero1": case(pp=2, dp=2, zero=1),
    "uneven_layers_pp4": case(pp=4, layers=6, m=4),
    # layers + 2 chunks: the embedding alone on the first chunk, the head alone on the last (Llama 3)
    "interleaved_pp2_embedding_and_head_alone": case(pp=2, schedule="interleaved", v=2, m=4, layers=2),
    # the backend's send/recv (gloo here, nccl on GPUs) instead of shared memory
    "1f1b_pp4_m8_backend": case(pp=4, m=8, p2p="backend"),
    "interleaved_pp2_m4_backend": case(pp=2, schedule="interleaved", v=2, m=4, p2p="backend"),
    "zb-h1_pp2_m4_dp2_backend": case(pp=2, dp=2, schedule="zb-h1", m=4, p2p="backend"),
    "zb-v_pp4_m8_backend": case(pp=4, schedule="zb-v", v=2, m=8, p2p="backend"),
    "zb-v_pp2_recompute_full": case(pp=2, schedule="zb-v", v=2, m=4, recompute="full"),
    "zb-h1_pp2_tp2_sp": case(pp=2, tp=2, schedule="zb-h1", m=4, sp=True),
    "gpipe_dp2_pp2_tp2_backend": case(dp=2, pp=2, tp=2, schedule="gpipe", m=4, p2p="backend"),
    "1f1b_pp2_m4_shm": case(pp=2, m=4, p2p="shm"),
    # tied embeddings on a V: the embedding's chunk and the head's are both on pipeline rank 0, whose two copies
    # are summed there (data_parallel.tied_pair), with TP, SP, DP and the backend's transport beside it
    "zb-v_pp2_m4_tied": case(pp=2, schedule="zb-v", v=2, m=4, tied=True),
    "dualpipe-v_pp4_m8_tp2_tied": case(pp=4, tp=2, schedule="dualpipe-v", v=2, m=8, tied=True),
    "zb-v_dp2_pp2_tp2_sp_tied_backend": case(dp=2, pp=2, tp=2, schedule="zb-v", v=2, m=4, sp=True, tied=True,
                                             p2p="backend"),
})
# a layout given (--pipeline-layout, Megatron-Core's pipeline_model_parallel_layout) instead of the partition's:
# lopsided, and with the embedding alone on the first chunk of an interleaved run
LAYOUTS["1f1b_pp2_layout_1_7"] = case(pp=2, m=4)
LAYOUTS["1f1b_pp2_layout_1_7"]["parallel"]["pipeline_layout"] = [1, 7]
LAYOUTS["interleaved_pp2_layout_0_3_3_2"] = case(pp=2, schedule="interleaved", v=2, m=4)
LAYOUTS["interleaved_pp2_layout_0_3_3_2"]["parallel"]["pipeline_layout"] = [0, 3, 3, 2]
REFS: dict[str, tuple[str, dict]] = {}
for _n, _c in LAYOUTS.items():
    REFS.setdefault(repr(reference_of(_c)), (f"ref{len(REFS)}", reference_of(_c)))
REF_OF = {n: REFS[repr(reference_of(c))][0] for n, c in LAYOUTS.items()}


@pytest.fixture(scope="module")
def world() -> list[dict]:
    import time

    cases = list(REFS.values()) + list(LAYOUTS.items())
    started = time.time()
    results = run_world(run_cases, 8, cases, {"capture_grads": True, "capture_params": True}, timeout_s=300)
    return [dict(r, _started=started) for r in results]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_losses_match_reference(world, name):
    got, ref = losses(world, name), losses(world, REF_OF[name])
    assert len(got) == 3
    for step, (a, b) in enumerate(zip(got, ref)):
        assert abs(a - b) <= TOL, f"{name} step {step}: {a} vs reference {b}"


@pytest.mark.parametrize("name", [n for n in LAYOUTS if "tied" in n])
def test_a_tied_embedding_counts_once_in_the_gradient_norm(world, name):
    """The gradient norm each step clips by is the one-process run's: the head's copy of a tied embedding is not
    counted beside the embedding (on one rank in a V, on two ranks otherwise)."""
    def norms(n: str) -> list[float]:
        r0 = next(r[n] for r in world if n in r and r[n]["rank"] == 0)
        return [h["grad_norm"] for h in r0["history"]]

    for step, (a, b) in enumerate(zip(norms(name), norms(REF_OF[name]))):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), f"{name} step {step}: gradient norm {a} vs reference {b}"


@pytest.mark.parametrize("name", [n for n in LAYOUTS if "zero1" not in n])
def test_gradients_match_reference(world, name):
    assert_matches_reference(world, name, REF_OF[name], "grads")


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_parameters_match_reference(world, name):
    assert_matches_reference(world, name, REF_OF[name], "params")


@pytest.mark.parametrize("name,bounds", [("1f1b_pp2_layout_1_7", {0: [(0, 2)], 1: [(2, 10)]}),
                                         ("interleaved_pp2_layout_0_3_3_2", {0: [(0, 1), (4, 7)],
                                                                             1: [(1, 4), (7, 10)]})])
def test_a_given_pipeline_layout_is_the_layout_run(world, name, bounds):
    """parallel.pipeline_layout cuts the model as given (units: 0 the embedding, 1-8 the blocks, 9 the head),
    not as the balanced partition would; the losses, gradients and parameters above match the reference."""
    for r in world:
        if name in r:
            assert [tuple(b) for b in r[name]["bounds"]] == bounds[r[name]["coord"][1]], name


def test_transport_is_the_one_asked_for(world):
    """CPU ranks on one host use shared memory unless told otherwise (a silent fall back to the
    backend would leave the shared-memory path untested)."""
    for name in LAYOUTS:
        used = {r[name]["p2p_transport"] for r in world if name in r}
        assert used == ({"backend"} if name.endswith("_backend") else {"shm"}), (name, used)


def test_no_shared_memory_left_behind(world):
    import glob
    import os

    # only this world's files count (a run killed elsewhere, before its ranks met, may leave one)
    mine = [f for f in glob.glob("/dev/shm/par3d-*") if os.stat(f).st_mtime >= world[0]["_started"] - 1]
    assert not mine


def _per_rank(world, name):
    return sorted((r[name] for r in world if name in r), key=lambda x: x["coord"][1])


@pytest.mark.parametrize("sched", ["zb-h1", "zb-v", "dualpipe-v"])
def test_split_backward_memory_follows_the_schedule(world, sched):
    """A split backward frees a micro-batch's activations at BW, so what a rank keeps alive is
    bounded by the checker's in-flight count (F done, B or BW not) times one forward's bytes."""
    p, m = 4, 8
    for r in _per_rank(world, f"{sched}_pp{p}_m{m}"):
        assert r["activation_bytes_per_microbatch"] > 0
        assert r["peak_activation_bytes"] <= r["peak_inflight_predicted"] * r["activation_bytes_per_microbatch"]


@pytest.mark.parametrize("sched", ["gpipe", "1f1b"])
def test_activation_memory_follows_the_schedule(world, sched):
    """Saved-tensor hooks measure what each rank keeps alive: GPipe holds all m micro-batches,
    1F1B at most p - rank (seed 4.3)."""
    p, m = 4, 8
    for r in _per_rank(world, f"{sched}_pp{p}_m{m}"):
        rank = r["coord"][1]
        inflight = m if sched == "gpipe" else min(p - rank, m)
        assert r["peak_inflight_predicted"] == inflight
        per_mb = r["activation_bytes_per_microbatch"]
        assert per_mb > 0
        assert r["peak_activation_bytes"] <= inflight * per_mb
        assert r["peak_activation_bytes"] > (inflight - 1) * per_mb


def test_recomputation_lowers_activation_memory(world):
    base = {r["coord"][1]: r["peak_activation_bytes"] for r in _per_rank(world, "1f1b_pp2_m4")}
    sel = {r["coord"][1]: r["peak_activation_bytes"] for r in _per_rank(world, "1f1b_pp2_recompute_selective")}
    full = {r["coord"][1]: r["peak_activation_bytes"] for r in _per_rank(world, "1f1b_pp2_recompute_full")}
    for rank in base:
        assert full[rank] < sel[rank] < base[rank], (rank, base[rank], sel[rank], full[rank])
