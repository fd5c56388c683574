"""Unit checks of the planner's pieces: catalogue, comm, memory formulas, peaks, search invariants."""

from __future__ import annotations

import json

import pytest

from par3d.pipeline.schedules import build, check
from par3d.plan import comm
from par3d.plan.cost import Choice, evaluate, peak_inflight
from par3d.plan.hardware import LINKS, make_cluster
from par3d.plan.memory import layer_activation_bytes, state_bytes_per_param
from par3d.plan.models import CATALOGUE, ModelSpec, resolve_model


def test_catalogue_sizes():
    assert CATALOGUE["gpt3-175b"].params() == pytest.approx(175e9, rel=0.01)
    assert CATALOGUE["llama2-7b"].params() == pytest.approx(6.74e9, rel=0.01)
    assert CATALOGUE["llama2-70b"].params() == pytest.approx(69.0e9, rel=0.01)
    assert CATALOGUE["llama3-8b"].params() == pytest.approx(8.03e9, rel=0.01)
    assert CATALOGUE["seed-96l"].layers * CATALOGUE["seed-96l"].layer_params() == pytest.approx(19.3e9, rel=0.01)


def test_hf_config(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 8192, "hidden_act": "silu", "tie_word_embeddings": False}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = resolve_model(str(p))
    assert m.params() == pytest.approx(CATALOGUE["llama3-8b"].params(), rel=1e-6)
    assert resolve_model(str(p), seq_len=2048).seq_len == 2048


def test_ring_formulas():
    link = LINKS["nvlink3"]
    n, e = 67.1e6, 8
    ar = comm.all_reduce(n, e, link)
    assert ar.alpha == pytest.approx(2 * 7 * 3e-6)
    assert ar.beta == pytest.approx(2 * 7 / 8 * n / 300e9)
    rs, ag = comm.reduce_scatter(n, e, link), comm.all_gather(n, e, link)
    assert (rs + ag).total == pytest.approx(ar.total)
    assert comm.all_reduce(n, 1, link).total == 0


def test_korthikanti_formulas():
    m = ModelSpec("k", 1, 12288, 96, 2048, 51200)
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert layer_activation_bytes(m, b, 1, False, "none") == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert layer_activation_bytes(m, b, t, False, "none") == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert layer_activation_bytes(m, b, t, True, "none") == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert layer_activation_bytes(m, b, t, True, "selective") == pytest.approx(sbh * 34 / t)
    assert layer_activation_bytes(m, b, t, True, "full") == pytest.approx(2 * sbh / t)


def test_zero_sharding():
    assert sum(state_bytes_per_param("bf16", 0, 8)) == 16
    assert state_bytes_per_param("bf16", 1, 8) == (2, 2, 1.5)
    assert state_bytes_per_param("bf16", 2, 8) == (2, 0.25, 1.5)
    assert state_bytes_per_param("bf16", 3, 8) == (0.25, 0.25, 1.5)


@pytest.mark.parametrize("sched,p,m,v", [("1f1b", 4, 16, 1), ("1f1b", 4, 3, 1), ("zb-h1", 4, 12, 1),
                                         ("interleaved", 4, 16, 2), ("interleaved", 2, 8, 3), ("gpipe", 4, 11, 1)])
def test_peak_inflight_matches_full_check(sched, p, m, v):
    assert list(peak_inflight(sched, p, m, v)) == check(build(sched, p, m, v), p, m, v).peak_inflight


def test_1f1b_peaks():
    assert peak_inflight("1f1b", 8, 96, 1) == tuple(min(8 - r, 96) for r in range(8))
    assert peak_inflight("gpipe", 8, 96, 1) == (96,) * 8


def test_more_memory_less_time_monotone():
    model, cl = CATALOGUE["gpt3-13b"], make_cluster("a100-80gb", 64)
    plans = [evaluate(model, cl, Choice(8, 2, 4, 1, 32, "1f1b", 1, r, 0, True)) for r in ("none", "selective", "full")]
    assert plans[0].memory.activations > plans[1].memory.activations > plans[2].memory.activations
    assert plans[0].step_time <= plans[1].step_time < plans[2].step_time
    assert plans[2].hardware_tflops_per_gpu > plans[2].model_tflops_per_gpu
    z = [evaluate(model, cl, Choice(8, 2, 4, 1, 32, "1f1b", 1, "none", k, True)) for k in (0, 1, 2, 3)]
    assert z[0].memory.total > z[1].memory.total > z[2].memory.total > z[3].memory.total


def test_bubble_from_simulator_and_interleaving_helps():
    model, cl = CATALOGUE["gpt3-13b"], make_cluster("a100-80gb", 64)
    a = evaluate(model, cl, Choice(8, 8, 1, 1, 16, "1f1b", 1, "selective", 0, True))
    b = evaluate(model, cl, Choice(8, 8, 1, 1, 16, "interleaved", 5, "selective", 0, True))
    assert 0.2 < a.bubble_fraction < 0.4  # ≈ (p-1)/(m+p-1) = 7/23
    assert b.bubble_fraction < a.bubble_fraction
