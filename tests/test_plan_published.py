"""Predictions at the published configuration of large training runs vs the published numbers.

Source: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC'21), Table 1 (weak scaling on A100-80GB, HDR InfiniBand, seq 2048, vocab 51200,
activation recomputation on) and §5.1's GPT-3 175B on 1024 GPUs with batch 1536 (140 TFLOP/s).
Megatron's TFLOP/s count the recomputation, so they compare with our hardware TFLOP/s per GPU.
Assumed where the paper's table is silent: micro-batch 1, the non-interleaved 1F1B schedule, no
sequence parallelism, no ZeRO.  docs/planner.md lists the errors; the bound here is 25%.
"""

from __future__ import annotations

import pytest

from par3d.plan.hardware import make_cluster
from par3d.plan.models import ModelSpec
from par3d.plan.search import Fixed, Limits, search

# name, layers, hidden, heads, tp, pp, gpus, global batch, published TFLOP/s per GPU
ROWS = [
    ("18.4B", 40, 6144, 48, 8, 1, 256, 1024, 135),
    ("39.1B", 48, 8192, 64, 8, 2, 512, 1536, 138),
    ("76.1B", 60, 10240, 80, 8, 4, 1024, 1792, 140),
    ("145.6B", 80, 12288, 96, 8, 8, 1536, 2304, 148),
    ("310.1B", 96, 16384, 128, 8, 16, 1920, 2160, 155),
    ("GPT-3 175B", 96, 12288, 96, 8, 8, 1024, 1536, 140),
]
BOUND = 0.25


def predict(layers, hidden, heads, tp, pp, gpus, batch, name="m"):
    model = ModelSpec(name, layers, hidden, heads, 2048, 51200)
    fixed = Fixed(tp=tp, pp=pp, micro_batch=1, recompute="full", zero_stage=0, sequence_parallel=False,
                  schedule="1f1b")
    res = search(model, make_cluster("a100-80gb", gpus), batch, fixed, Limits(), top=1)
    return res.plans[0]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_megatron_2021(row):
    name, layers, hidden, heads, tp, pp, gpus, batch, published = row
    plan = predict(layers, hidden, heads, tp, pp, gpus, batch, name)
    assert plan.fits
    assert (plan.choice.tp, plan.choice.pp, plan.choice.dp) == (tp, pp, gpus // (tp * pp))
    err = plan.hardware_tflops_per_gpu / published - 1
    assert abs(err) <= BOUND, f"{name}: predicted {plan.hardware_tflops_per_gpu:.1f} vs {published} ({err:+.1%})"
