"""Random layouts against the one-process reference: combinations the named suites do not list.

Each case draws a layout (dp, pp, tp, cp with dp·pp·tp·cp <= 8; a schedule and its v and m; a ZeRO stage;
sequence parallelism; recomputation; the transport) and a model (GPT or Llama-style, grouped-query heads,
tied or not, widths, norms, positions, activations, biases, an odd vocabulary, a given pipeline cut,
clipping and weight decay), keeps it if `RunConfig.validate` accepts it, and runs it beside its one-process
reference in ONE world of 8 gloo ranks: losses of 2 steps, step-1 gradients and the parameters after step 2
must match within TOL (fp32).  The draw is seeded (`SEED`); `PAR3D_RANDOM_LAYOUTS=N` runs N cases instead of
the default 12 (a session ran 340 layouts and 66 checkpoint reshards this way, issue 12's sixty-second round:
all matched; the one refusal they met, tied embeddings on the V schedules, is what that round lifted)."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import pytest
from distributed_helper import run_world
from equiv_common import TOL, case, losses, max_diff, merged, reference_of, run_cases

SEED = 63  # a draw of 12 that holds CP (with a pipeline), a tied V, ZeRO-3, a given cut and TP 4 (checked below)
N = int(os.environ.get("PAR3D_RANDOM_LAYOUTS", "12"))
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-v", 2), ("dualpipe-v", 2)]


def draw(rng: random.Random) -> dict[str, Any]:
    """One valid random configuration (drawn again until `validate` accepts it)."""
    from par3d.config import ConfigError, RunConfig

    while True:
        tp, cp, pp, dp = (rng.choice([1, 1, 2, 4]), rng.choice([1, 1, 2]), rng.choice([1, 2, 2, 4]),
                          rng.choice([1, 2, 4]))
        if not 1 < tp * cp * pp * dp <= 8:
            continue
        schedule, v = rng.choice(SCHEDULES) if pp > 1 else ("1f1b", 1)
        k = 2 if schedule == "dualpipe-v" else 1
        m = rng.choice([k * pp, 2 * k * pp]) if pp > 1 else rng.choice([1, 2])
        if 16 % (m * dp):
            continue
        arch = rng.choice(["gpt", "llama"])
        cfg = case(dp=dp, pp=pp, tp=tp, cp=cp, schedule=schedule, m=m, v=v,
                   zero=rng.choice([0, 1, 2, 3]) if dp > 1 else 0, sp=tp > 1 and rng.random() < 0.5,
                   recompute=rng.choice(["none", "none", "full", "selective"]), tied=rng.random() < 0.3,
                   p2p=rng.choice(["auto", "auto", "backend", "shm"]) if pp > 1 else "auto",
                   layers=rng.choice([2, 3, 4, 5, 6, 8]), arch=arch,
                   kv_heads=rng.choice([None, 1, 2, 4]) if arch == "llama" else None, steps=2)
        model, train = cfg["model"], cfg["train"]
        if rng.random() < 0.5:
            model.update(hidden=rng.choice([32, 48, 64]), heads=rng.choice([2, 4, 8]))
        for key, values, p in (("ffn_hidden", [24, 40, 64, 96], 0.4), ("norm", ["layernorm", "rmsnorm"], 0.4),
                               ("position", ["learned", "rope"], 0.4), ("gated_mlp", [False, True], 0.4),
                               ("activation", ["gelu", "gelu_tanh", "silu"], 0.3), ("bias", [False, True], 0.3),
                               ("vocab", [250, 257, 300], 0.3), ("seq_len", [8, 24, 32], 0.3)):
            if rng.random() < p:
                model[key] = rng.choice(values)
        for key, values in (("grad_clip", [0.0, 0.05]), ("weight_decay", [0.0, 0.3])):
            if rng.random() < 0.3:
                train[key] = rng.choice(values)
        if pp > 1 and rng.random() < 0.3:  # a given cut, as Megatron-Core's pipeline_model_parallel_layout
            cuts = sorted(rng.randrange(model["layers"] + 1) for _ in range(pp * v - 1))
            cfg["parallel"]["pipeline_layout"] = [b - a for a, b in zip([0, *cuts], [*cuts, model["layers"]])]
        try:
            RunConfig.from_dict(json.loads(json.dumps(cfg))).validate()
        except ConfigError:
            continue
        return cfg


def _cases() -> tuple[dict[str, dict], dict[str, str], list[tuple[str, dict]]]:
    rng = random.Random(SEED)
    layouts = {f"random{i}": draw(rng) for i in range(N)}
    refs: dict[str, tuple[str, dict]] = {}
    for cfg in layouts.values():
        refs.setdefault(repr(reference_of(cfg)), (f"ref{len(refs)}", reference_of(cfg)))
    ref_of = {n: refs[repr(reference_of(c))][0] for n, c in layouts.items()}
    return layouts, ref_of, list(refs.values())


LAYOUTS, REF_OF, REFS = _cases()


@pytest.fixture(scope="module")
def world() -> list[dict]:
    return run_world(run_cases, 8, REFS + list(LAYOUTS.items()), {"capture_grads": True, "capture_params": True},
                     timeout_s=300)


def test_the_draw_covers_the_layouts_it_means_to():
    """The seeded draw is not degenerate: several layouts, schedules and models (a change to `case` or to the
    validation that shrank it to a few trivial layouts would fail here)."""
    par = [c["parallel"] for c in LAYOUTS.values()]
    assert len({(p["dp"], p["pp"], p["tp"], p["cp"]) for p in par}) >= min(N, 6)
    assert len({p["schedule"] for p in par if p["pp"] > 1}) >= min(N // 4, 3)
    assert len(set(REF_OF.values())) >= min(N // 2, 4)
    if N >= 12:  # the default seed was chosen so that its 12 draws hold these (a larger N draws the same 12 first)
        assert any(p["cp"] > 1 and p["pp"] > 1 for p in par)
        assert any(c["parallel"]["schedule"] in ("zb-v", "dualpipe-v") and c["model"]["tied_embeddings"]
                   for c in LAYOUTS.values())
        assert any(p["zero_stage"] == 3 for p in par) and any(p["tp"] == 4 for p in par)
        assert any(p.get("pipeline_layout") for p in par)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_random_layout_trains_as_the_one_process_run(world, name):
    cfg = LAYOUTS[name]
    ref = REF_OF[name]
    got, want = losses(world, name), losses(world, ref)
    assert len(got) == 2 and all(abs(a - b) <= TOL for a, b in zip(got, want)), (cfg["parallel"], got, want)
    for key in ("grads", "params"):
        diff, where = max_diff(merged(world, name, key), merged(world, ref, key))
        assert diff <= TOL, f"{name} {cfg['parallel']} {cfg['model']}: {key} of {where} differ by {diff}"
