"""The hybrid CNN (issue 3, item 5; seed 2.3 slides 17-18): data-parallel convolutions and
tensor-parallel fully-connected layers over the same 4 ranks, against one process.

One world of 4 gloo ranks trains the hybrid layout and the all-data-parallel layout for 3 steps
each; the parent process trains the same model, data and seed alone.  Losses and every parameter
(FC shards gathered) must agree within TOL; COUNTER's bytes per layer must equal the report's
prediction; and the FC layers must move far fewer bytes in hybrid than all-DP (the seed's point)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from distributed_helper import run_world

from par3d.hybrid_cnn import CNNConfig, HybridCNN, format_report, predicted_bytes, synthetic_batch, train

TOL = 1e-5
N, STEPS = 4, 3
CFG = CNNConfig()


def _worker(cfg: CNNConfig, steps: int) -> dict:
    out = {}
    for mode in ("hybrid", "dp"):
        out[mode] = train(dataclasses.replace(cfg, mode=mode), steps, capture_params=True)
    return out


@pytest.fixture(scope="module")
def world() -> list[dict]:
    return run_world(_worker, N, CFG, STEPS, timeout_s=60.0)


@pytest.fixture(scope="module")
def reference() -> dict:
    return train(CFG, STEPS, capture_params=True)


@pytest.mark.parametrize("mode", ["hybrid", "dp"])
def test_losses_match_one_process(world, reference, mode):
    ref = reference["losses"]
    assert len(ref) == STEPS
    for r in world:
        for step, (a, b) in enumerate(zip(r[mode]["losses"], ref)):
            assert abs(a - b) <= TOL, f"{mode} rank {r[mode]['rank']} step {step}: {a} vs {b}"


@pytest.mark.parametrize("mode", ["hybrid", "dp"])
def test_parameters_after_three_steps_match_one_process(world, reference, mode):
    ref = reference["params"]
    for r in world:
        got = r[mode]["params"]
        assert got.keys() == ref.keys()
        for name, t in ref.items():
            assert got[name].shape == t.shape
            diff = float((got[name] - t).abs().max())
            assert diff <= TOL, f"{mode} rank {r[mode]['rank']}: {name} differs by {diff}"
        # the parameters moved: the comparison is not of the initial values
    assert any(float((ref[k] - v).abs().max()) > 1e-3 for k, v in _initial_params().items())


def _initial_params() -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in HybridCNN(CFG).named_parameters()}


def test_fc_shards_are_slices_of_the_one_process_weights():
    full = HybridCNN(CFG)
    for rank in range(N):
        shard = HybridCNN(CFG, N, rank)
        assert torch.equal(shard.fc1.weight, full.fc1.weight.chunk(N, dim=0)[rank])
        assert torch.equal(shard.fc2.weight, full.fc2.weight.chunk(N, dim=1)[rank])
        assert torch.equal(shard.convs[0].weight, full.convs[0].weight)


@pytest.mark.parametrize("mode", ["hybrid", "dp"])
def test_measured_bytes_equal_the_report(world, mode):
    predicted = {row["layer"]: row[f"{mode}_bytes"] for row in predicted_bytes(CFG, N)}
    for r in world:
        assert len(r[mode]["measured"]) == STEPS
        for step, measured in enumerate(r[mode]["measured"]):
            assert measured == predicted, f"{mode} rank {r[mode]['rank']} step {step}"
        key = f"measured_{mode}_bytes"
        assert {row["layer"]: row[key] for row in r[mode]["report"]} == predicted


def test_report_is_the_seeds_accounting():
    rows = {row["layer"]: row for row in predicted_bytes(CFG, N)}
    b = CFG.batch
    # DP moves the parameters: C_out·C_in·k² (+ bias), independent of the batch
    assert rows["conv1"]["dp_bytes"] == (16 * 3 * 9 + 16) * 4
    assert rows["fc1"]["dp_bytes"] == (CFG.fc_hidden * CFG.features + CFG.fc_hidden) * 4
    # conv layers stay data-parallel in the hybrid
    assert all(rows[c]["hybrid_bytes"] == rows[c]["dp_bytes"] for c in ("conv1", "conv2"))
    # TP moves activations: the switch + f's backward (B·C_in each), g's forward (B·C_out)
    assert rows["fc1"]["hybrid_bytes"] == 2 * b * CFG.features * 4
    assert rows["fc2"]["hybrid_bytes"] == b * CFG.classes * 4
    # ...and for the default shapes that is far less than the parameters
    for fc in ("fc1", "fc2"):
        assert rows[fc]["dp_bytes"] >= 4 * rows[fc]["hybrid_bytes"], rows[fc]
    assert sum(r["hybrid_bytes"] for r in rows.values()) * 4 <= sum(r["dp_bytes"] for r in rows.values())
    text = format_report(list(rows.values()), CFG, N)
    assert "fc1" in text and "total" in text


def test_synthetic_data_is_deterministic_and_balanced():
    x1, y1 = synthetic_batch(256, 16, 0, 5)
    x2, y2 = synthetic_batch(256, 16, 0, 5)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == (256, 3, 16, 16) and set(y1.tolist()) == set(range(10))
    assert not torch.equal(synthetic_batch(256, 16, 0, 6)[0], x1)


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="batch"):
        HybridCNN(dataclasses.replace(CFG, batch=30), N, 0)
    with pytest.raises(ValueError, match="mode"):
        HybridCNN(dataclasses.replace(CFG, mode="pp"))
