"""The Llama-style architecture (RMSNorm, rotary positions, SwiGLU, grouped-query attention, no
biases, untied embeddings) against its single-process reference, under DP, PP (every schedule),
TP with K/V heads split (tp <= kv_heads) and replicated (tp > kv_heads), SP, recomputation,
ZeRO-1 and context parallelism — in ONE world of 8 gloo ranks: 3 steps' losses, step-1 gradients and the parameters after
step 3 equal the one-process run within TOL = 1e-5 (fp32), as for the GPT (tests/test_equiv_*.py)."""

from __future__ import annotations

import pytest
from distributed_helper import run_world
from equiv_common import TOL, assert_matches_reference, case, losses, reference_of, run_cases


def llama(**kw):
    kw.setdefault("kv_heads", 2)
    return case(arch="llama", layers=4, **kw)


LAYOUTS = {
    "tp2_kv_split": llama(tp=2),  # one K/V head per rank
    "tp4_kv_replicated": llama(tp=4),  # 2 K/V heads on 4 ranks: each pair shares a replicated head
    "tp4_kv_replicated_sp": llama(tp=4, sp=True),
    "tp2_sp_vocab250": llama(tp=2, sp=True, vocab=250),
    "tp2_dp2_zero1": llama(tp=2, dp=2, zero=1),
    "1f1b_pp2_m4": llama(pp=2, m=4),
    "interleaved_pp2_tp2": llama(pp=2, tp=2, schedule="interleaved", v=2, m=4),
    "zb-h1_pp2_dp2": llama(pp=2, dp=2, schedule="zb-h1", m=4),
    "zb-h1_pp2_tp4_kv_replicated": llama(pp=2, tp=4, schedule="zb-h1", m=4),  # split backward, F.linear K|V
    "gpipe_dp2_pp2_tp2": llama(dp=2, pp=2, tp=2, schedule="gpipe", m=4),
    "1f1b_pp2_recompute_full_tp2": llama(pp=2, tp=2, recompute="full"),
    "tp4_recompute_selective": llama(tp=4, recompute="selective"),
    "mha_tp2": llama(tp=2, kv_heads=4),  # kv_heads = heads: the fused Q|K|V projection with rotary
    "tied_pp2_tp2": llama(pp=2, tp=2, tied=True),
    # context parallelism: rotary angles at each CP rank's global positions, GQA K/V in the ring
    "cp2_tp2_kv_split": llama(cp=2, tp=2),
    "cp2_tp4_kv_replicated": llama(cp=2, tp=4),
}
REFS: dict[str, tuple[str, dict]] = {}
for _n, _c in LAYOUTS.items():
    REFS.setdefault(repr(reference_of(_c)), (f"ref{len(REFS)}", reference_of(_c)))
REF_OF = {n: REFS[repr(reference_of(c))][0] for n, c in LAYOUTS.items()}


@pytest.fixture(scope="module")
def world() -> list[dict]:
    cases = list(REFS.values()) + list(LAYOUTS.items())
    return run_world(run_cases, 8, cases, {"capture_grads": True, "capture_params": True}, timeout_s=300)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_llama_losses_match_reference(world, name):
    got, ref = losses(world, name), losses(world, REF_OF[name])
    assert len(got) == len(ref) == 3
    for step, (a, b) in enumerate(zip(got, ref)):
        assert abs(a - b) <= TOL, f"{name} step {step}: loss {a} vs reference {b}"
    assert got[-1] < got[0], "the loss should fall over 3 steps"


@pytest.mark.parametrize("name", [n for n in LAYOUTS if "zero1" not in n])
def test_llama_gradients_match_reference(world, name):
    assert_matches_reference(world, name, REF_OF[name], "grads")


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_llama_parameters_after_three_steps_match_reference(world, name):
    assert_matches_reference(world, name, REF_OF[name], "params")


def test_llama_parameter_names_and_shapes(world):
    """No biases, no position table, RMSNorm weights only, K|V of kv_heads heads, gated fc1."""
    params = next(r[REF_OF["tp2_kv_split"]]["params"] for r in world
                  if REF_OF["tp2_kv_split"] in r and r[REF_OF["tp2_kv_split"]].get("params"))
    assert not [n for n in params if n.endswith(".bias")]
    assert "embedding.pos" not in params and "head.weight" in params
    h, hd = 32, 8
    assert tuple(params["blocks.0.attn.q.weight"].shape) == (h, h)
    assert tuple(params["blocks.0.attn.kv.weight"].shape) == (2 * 2 * hd, h)
    assert tuple(params["blocks.0.mlp.fc1.weight"].shape) == (2 * 4 * h, h)
    assert tuple(params["blocks.0.ln1.weight"].shape) == (h,)
