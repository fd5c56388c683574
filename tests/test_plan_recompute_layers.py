"""Block-method partial recomputation in the planner (`Choice.recompute_layers`, `par3d plan --recompute-layers`):
time, memory and hardware FLOPs between no recomputation and full, equal to full when every layer is rerun."""

from __future__ import annotations

import json

import pytest
from test_plan_cli import run  # `par3d plan` in-process: (rc, stdout, stderr)

from par3d.plan.cost import Choice, evaluate, stage_times
from par3d.plan.hardware import make_cluster
from par3d.plan.models import CATALOGUE
from par3d.plan.plan_memory import memory
from par3d.plan.search import Fixed, Limits, PlanError, search
from par3d.plan.stage_layout import layout

MODEL = CATALOGUE["llama3-70b"]  # 80 layers: 19, 21, 21, 19 per stage at pp 4 (the embedding and head weigh in)
CLUSTER = make_cluster("h100-sxm", 64)


def choice(rec: str, n: int = 0, zero: int = 1) -> Choice:
    return Choice(4, 4, 4, 1, 32, "1f1b", 1, rec, zero, True, 1, 1, n)


@pytest.mark.parametrize("zero", [1, 3])
def test_between_none_and_full_and_full_when_every_layer_reruns(zero):
    """More recomputed layers: less memory, a longer step; N >= a chunk's layers is full recomputation."""
    plans = [evaluate(MODEL, CLUSTER, choice("none", zero=zero))]
    plans += [evaluate(MODEL, CLUSTER, choice("full", n, zero)) for n in (1, 5, 10, 19)]
    plans += [evaluate(MODEL, CLUSTER, choice("full", zero=zero))]
    acts = [p.memory.activations for p in plans]
    steps = [p.step_time for p in plans]
    hw = [p.hardware_tflops_per_gpu * p.step_time for p in plans]  # hardware FLOPs per step per GPU
    assert acts == sorted(acts, reverse=True) and len(set(acts)) == len(acts)
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert hw == sorted(hw) and hw[0] < hw[-1]
    for n in (21, 30):  # every layer of every chunk (at most 21)
        same = evaluate(MODEL, CLUSTER, choice("full", n, zero))
        assert same.step_time == plans[-1].step_time
        assert same.memory.total == plans[-1].memory.total


def test_recomputes_n_layers_of_each_stage():
    """A stage's recompute time is N of its layers' forward (the block method), the rest as stored."""
    full = stage_times(MODEL, CLUSTER, choice("full"))
    five = stage_times(MODEL, CLUSTER, choice("full", 5))
    for f, p, n in zip(full.b_recompute, five.b_recompute, layout(MODEL, 4).layers):
        assert p == pytest.approx(f * 5 / n, rel=1e-12)
    assert five.f == full.f  # the forward is untouched
    mem = memory(MODEL, CLUSTER, choice("full", 5))[0]
    assert memory(MODEL, CLUSTER, choice("full"))[0].activations < mem.activations


def test_search_fixes_the_block_method_and_refuses_what_cannot_price_it():
    res = search(MODEL, CLUSTER, 128, Fixed(tp=4, pp=4, recompute_layers=3), Limits(), top=3)
    assert res.plans and all(p.choice.recompute == "full" and p.choice.recompute_layers == 3 for p in res.plans)
    assert "recompute=full(3)" in res.plans[0].choice.label()
    with pytest.raises(PlanError, match="--recompute selective") as e:
        search(MODEL, CLUSTER, 128, Fixed(recompute="selective", recompute_layers=3), Limits())
    assert e.value.flag == "--recompute-layers"
    from dataclasses import replace

    with pytest.raises(PlanError, match="submodule"):
        search(MODEL, replace(CLUSTER, zero3_unit="submodule"), 128, Fixed(recompute_layers=3), Limits())


def test_cli(capsys, tmp_path):
    base = ["--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--global-batch", "128", "--tp", "4",
            "--pp", "4"]
    rc, out, _ = run(capsys, *base, "--recompute-layers", "2", "--json", "--top", "2")
    assert rc == 0
    plans = json.loads(out)["plans"]
    assert plans and all(p["recompute"] == "full" and p["recompute_layers"] == 2 for p in plans)
    rc, out, _ = run(capsys, *base, "--recompute-layers", "2", "--top", "1")
    assert rc == 0 and "  full(2) " in out and "recompute=full(2)" in out
    for argv, word in ((["--recompute", "none", "--recompute-layers", "2"], "--recompute none"),
                       (["--recompute-layers", "2", "--emit-config", str(tmp_path / "x.toml")], "par3d train")):
        rc, _, err = run(capsys, *base, *argv)
        assert rc == 2 and "--recompute-layers" in err and word in err and "Traceback" not in err
