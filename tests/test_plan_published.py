"""The public validation set (src/par3d/plan/validation.toml): every published run predicted at its
published layout, with one description of each GPU and cluster.  docs/planner.md tables the errors.

Each row is asserted within its bound (10 % unless the row is a documented miss with a note); the
set must hold the rows issue 12 names; and the searches of the acceptance criteria rank as measured.
"""

from __future__ import annotations

import pytest

from par3d.plan import validation
from par3d.plan.hardware import make_cluster
from par3d.plan.models import CATALOGUE
from par3d.plan.search import Fixed, Limits, search

ROWS = validation.rows()


@pytest.fixture(scope="module")
def predictions():
    return {r["name"]: validation.predict(r) for r in ROWS}


def test_the_set_holds_the_named_runs():
    names = {r["name"] for r in ROWS}
    assert sum(n.startswith("narayanan2021-t1-") for n in names) == 10  # all ten rows of Table 1
    assert "narayanan2021-gpt3-175B-1024" in names
    assert sum(n.startswith("narayanan2021-t2-zero3-") for n in names) == 6
    assert {"bloom-176B", "llama3-405B-8192", "llama3-405B-16384"} <= names
    for r in ROWS:
        assert r["source"] and r["published"] > 0 and r["metric"] in ("hardware", "model")
        assert float(r.get("bound", 0.10)) == 0.10 or r.get("note"), f"{r['name']}: a miss needs a note"


@pytest.mark.parametrize("name", [r["name"] for r in ROWS])
def test_row_within_its_bound(predictions, name):
    p = predictions[name]
    assert abs(p.error) <= p.bound, f"{name}: predicted {p.value:.1f} vs {p.row['published']} ({p.error:+.1%})"
    assert p.fits or p.row.get("evaluate_unfit")


def test_most_rows_within_ten_percent(predictions):
    errs = sorted(abs(p.error) for p in predictions.values())
    assert sum(e <= 0.10 for e in errs) >= 26 and errs[len(errs) // 2] <= 0.05


def test_zero3_without_model_parallelism_ranks_below_tp_pp():
    model = CATALOGUE["gpt3-175b"]
    for gpus in (768, 1536):
        cl = make_cluster("a100-80gb", gpus)
        best = search(model, cl, 1536, Fixed(), Limits(), top=1).plans[0]
        z3 = search(model, cl, 1536, Fixed(tp=1, pp=1, zero_stage=3), Limits(), top=1).plans[0]
        assert best.choice.tp > 1 and best.choice.pp > 1
        assert z3.step_time > 1.5 * best.step_time  # measured: 40-70 % slower


def test_unconstrained_gpt3_search_ranks_tp_pp_first():
    res = search(CATALOGUE["gpt3-175b"], make_cluster("a100-80gb", 1024), 1536, Fixed(), Limits(), top=5)
    assert all(p.choice.tp > 1 and p.choice.pp > 1 for p in res.plans)
    # with the software of the paper (no FlashAttention, full recomputation, no SP) the best plan found
    # is TP+PP too, at least the published layout's prediction and within 20 % of the published 140
    # TFLOP/s: the search finds layouts faster than the paper's (tp 4, more chunks), docs/planner.md
    paper = search(CATALOGUE["gpt3-175b"], make_cluster("a100-80gb", 1024, flash_attention=False), 1536,
                   Fixed(recompute="full", sequence_parallel=False, zero_stage=0), Limits(), top=1).plans[0]
    assert paper.choice.tp > 1 and paper.choice.pp > 1
    published_layout = validation.predict(next(r for r in ROWS if r["name"] == "narayanan2021-gpt3-175B-1024"))
    assert published_layout.value <= paper.hardware_tflops_per_gpu * (1 + 1e-9) <= 1.2 * 140


def test_llama3_long_context_plans():
    model = CATALOGUE["llama3-405b"]
    from dataclasses import replace

    res = search(replace(model, seq_len=131072), make_cluster("h100-sxm", 16384), 128,
                 Fixed(tp=8, pp=16, cp=16), Limits(), top=1)
    assert res.plans and res.plans[0].choice.cp == 16
