"""Bring what the validation set's figures feed back in step after a change (`python -m par3d.plan.validation
--refresh`; issue 12's forty-eighth round).

A change to a row's facts or to the model moves predictions.  Several files quote them and the tests hold each to
the planner's own output: evidence.json and leave_one_out.json (beside this file), the generated tables of
docs/planner.md and docs/planner_rounds.md, and every documented miss's `bound` and `note` in validation.toml (a
bounded row's bound is its |error| rounded up to the hundredth and its note quotes the error; tests/
test_plan_published.py).  This module rewrites them from one pricing of the set, so that a round is not carried by
scripts outside the repository.

What it does not write: the prose that quotes figures (README.md's bullet, docs/planner.md's readings and
docs/planner_rounds.md's round entries) -- a person writes those, and the tests name each figure that is stale.

The docs' generated blocks sit between two HTML comments, `<!-- generated: NAME -->` and `<!-- end generated: NAME
-->`, which markdown does not render; the text between them is replaced whole.

Notes: a row whose error moved keeps its history.  Its new note says where it stands since this round and why
(`reason`, one short phrase naming the round's change: the round's entry in docs/planner_rounds.md says the rest),
the error before, and then the old note after "before that: ", as the notes of earlier rounds do.  A row that was
within and is not needs the error it had before: `before` (a `--json` report written before the change).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from typing import Any

# Each generated block and the doc (relative to the checkout) it sits in.
BLOCKS = {
    "validation-table": "docs/planner.md",  # validation_report.table + summary: `python -m par3d.plan.validation`
    "validation-by-gpu": "docs/planner.md",  # validation_report.by_gpu, printed below them
    "validation-scaling": "docs/planner.md",  # validation_report.scale_table: `--scaling`
    "validation-software": "docs/planner.md",  # --software's table
    "validation-frameworks": "docs/planner.md",  # --software's second table, by framework preset
    "leave-one-out": "docs/planner.md",  # --leave-one-out's two tables
    "leave-one-out-swap": "docs/planner.md",
    "moe-layers": "docs/planner_rounds.md",  # `python -m par3d.plan.moe_layers`
}
BEGIN = "<!-- generated: {name} -->"
END = "<!-- end generated: {name} -->"


def repo_root(start: str | None = None) -> str:
    """The checkout holding docs/planner.md above this package (refreshing is a developer's step: an installed
    wheel has no docs to rewrite)."""
    here = os.path.abspath(start or os.path.dirname(__file__))
    while True:
        if os.path.isfile(os.path.join(here, "docs", "planner.md")) and os.path.isdir(os.path.join(here, "src")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            raise FileNotFoundError("--refresh: no checkout found above src/par3d/plan (docs/planner.md is not "
                                    "there); run it from a clone of the repository, installed editable "
                                    "(`make install`)")
        here = parent


def replace_block(text: str, name: str, body: str) -> tuple[str, bool]:
    """`text` with the generated block `name` replaced by `body`; whether it changed.  A block that is absent, or
    present twice, is an error: the docs must say where each table goes."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"generated block {name!r}: expected one '{begin}' and one '{end}', found "
                         f"{text.count(begin)} and {text.count(end)}")
    a = text.index(begin) + len(begin)
    b = text.index(end)
    if b < a:
        raise ValueError(f"generated block {name!r}: its end comes before its beginning")
    new = text[:a] + "\n" + body.strip("\n") + "\n" + text[b:]
    return new, new != text


def bound_of(error: float) -> float:
    """A documented miss's bound: its |error| rounded up to the hundredth (tests/test_plan_published.py)."""
    return math.ceil(abs(error) * 100 - 1e-9) / 100


def quoted(error: float) -> str:
    """How a note quotes an error ("+13.9 %"), as the test looks for it."""
    return f"{100 * error:+.1f} %"


def note_update(row: dict[str, Any], error: float, before: float | None, round_name: str, reason: str,
                default_bound: float = 0.10) -> tuple[float | None, str | None] | None:
    """The (bound, note) a row should carry at `error`, or None where both stand as they are.

    `before`: the row's error before the change (None where not known: then a bounded row's own note is what it
    was).  Bound None = the default (the row is within)."""
    old_bound = row.get("bound")
    old_note = row.get("note")
    miss = abs(error) > default_bound
    if old_bound is not None and float(old_bound) > default_bound:  # a documented miss
        if miss and quoted(error) in str(old_note):  # the note stands; the bound at most tightens or loosens
            return None if abs(float(old_bound) - bound_of(error)) < 1e-9 else (bound_of(error), old_note)
        was = quoted(before) if before is not None else _quoted_in(str(old_note))
        if miss:
            return bound_of(error), (f"a miss at {quoted(error)} since issue 12's {round_name} round ({reason}); "
                                     f"{was} before; before that: {old_note}")
        return None, (f"within since issue 12's {round_name} round ({quoted(error)}; {reason}), a miss at {was} "
                      f"before; before that: {old_note}")
    if not miss:
        return None
    if before is None:
        raise ValueError(f"{row['name']}: a new miss at {quoted(error)}; its error before the change is needed "
                         "(--before, a --json report written before it)")
    note = f"a miss at {quoted(error)} since issue 12's {round_name} round ({reason}); {quoted(before)} before"
    return bound_of(error), (note + f"; before that: {old_note}" if old_note else note)


def _quoted_in(note: str) -> str:
    m = re.search(r"[+\-−]\d+\.\d %", note)
    return m.group(0) if m else "its quoted error"


def _toml_string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string is a TOML basic string (\", \\, \uXXXX)


def rewrite_rows(text: str, updates: dict[str, tuple[float | None, str | None]]) -> str:
    """validation.toml's text with each named row's `bound` and `note` set (None: the line removed).  A row's table
    runs to the next `[[` header, so its old lines are found even past a comment block (TOML keeps them in the row);
    the new ones go after the row's `published` line, as the rows have them; the row's other lines are left as
    they are."""
    lines = text.split("\n")
    heads = [k for k, line in enumerate(lines) if line.startswith("[[")] + [len(lines)]
    out: list[str] = lines[:heads[0]]
    seen: set[str] = set()
    for a, b in zip(heads, heads[1:], strict=False):
        body = lines[a:b]
        name_line = next((x for x in body if x.startswith("name = ")), None)
        name = json.loads(name_line.split("=", 1)[1].strip()) if name_line else None
        if body[0].strip() == "[[row]]" and name in updates:
            seen.add(name)
            bound, note = updates[name]
            kept = [x for x in body if not x.startswith("bound = ") and not x.startswith("note = ")]
            at = next((k + 1 for k, x in enumerate(kept) if x.startswith("published = ")), len(kept))
            extra = ([f"note = {_toml_string(note)}"] if note else []) + ([f"bound = {bound:g}"] if bound else [])
            body = kept[:at] + extra + kept[at:]
        out.extend(body)
    missing = set(updates) - seen
    if missing:
        raise ValueError(f"rows not found in validation.toml: {sorted(missing)}")
    return "\n".join(out)


def generated_blocks(preds: list[Any], loo_data: dict[str, Any] | None,
                     plain: list[Any] | None = None, named: list[Any] | None = None) -> dict[str, tuple[str, str]]:
    """Each generated block: (the doc it is in, relative to the checkout; its text).  `plain`, `named`: the rows priced
    `undescribed` and `named` already (evidence.json needs them too), so the software table does not price them
    again."""
    from . import evidence, moe_layers, validation_report
    from . import validation as v

    bodies = {
        "validation-table": validation_report.table(preds) + "\n\n" + validation_report.summary(preds),
        "validation-by-gpu": validation_report.by_gpu(preds),
        "validation-scaling": validation_report.scale_table(preds),
        "validation-software": validation_report.software_table(
            preds, whole=None if plain is None or named is None else evidence.software_figures(preds, plain, named)),
        "validation-frameworks": validation_report.framework_table(
            preds, plain if plain is not None else [v.predict_undescribed(p.row) for p in preds],
            named if named is not None else [v.predict_named(p.row) for p in preds]),
        "moe-layers": moe_layers.table(),
    }
    if loo_data is not None:
        from . import leave_one_out as loo

        bodies["leave-one-out"] = loo.table(loo_data)
        bodies["leave-one-out-swap"] = loo.swap_table(loo_data)
    blocks = {name: (BLOCKS[name], body) for name, body in bodies.items()}
    return blocks


def refresh(root: str, preds: list[Any], loo_data: dict[str, Any] | None, before: dict[str, float] | None,
            round_name: str | None, reason: str | None, write: bool,
            say: Callable[[str], None] = print, plain: list[Any] | None = None,
            named: list[Any] | None = None) -> list[str]:
    """Bring the docs' generated blocks and the rows' bounds and notes in step with `preds`.  Returns what is
    (with `write`: was) stale, one line each; with `write` False nothing is written."""
    from . import validation as v

    stale: list[str] = []
    docs: dict[str, str] = {}
    for name, (doc, body) in generated_blocks(preds, loo_data, plain, named).items():
        path = os.path.join(root, doc)
        text = docs.get(path)
        if text is None:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        text, changed = replace_block(text, name, body)
        docs[path] = text
        if changed:
            stale.append(f"{doc}: generated block {name!r}")
    updates: dict[str, tuple[float | None, str | None]] = {}
    for p in preds:
        prior = before.get(str(p.row["name"])) if before is not None else None
        try:
            up = note_update(p.row, p.error, prior, round_name or "<round>", reason or "<reason>", v.DEFAULT_BOUND)
        except ValueError as exc:
            if write:
                raise
            stale.append(f"validation.toml: {exc}")
            continue
        if up is not None:
            updates[str(p.row["name"])] = up
            stale.append(f"validation.toml: {p.row['name']} at {quoted(p.error)}: bound "
                         f"{p.row.get('bound', v.DEFAULT_BOUND)} -> {up[0] or v.DEFAULT_BOUND}")
    if write:
        if updates and (not round_name or not reason):
            raise ValueError(f"{len(updates)} rows' bounds and notes are stale: give --round (e.g. "
                             "'forty-eighth') and --reason (the round's change, a short phrase) to rewrite them")
        for path, text in docs.items():
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        if updates:
            with open(v.PATH, encoding="utf-8") as fh:
                toml = fh.read()
            with open(v.PATH, "w", encoding="utf-8") as fh:
                fh.write(rewrite_rows(toml, updates))
    for line in stale:
        say(("refreshed " if write else "stale: ") + line)
    return stale


def errors_of(report_json: str) -> dict[str, float]:
    """Each row's signed error (a fraction) from a `--json` report: predicted over published (the prediction is
    kept to a thousandth, `error_pct` only to a hundredth of a percent, which could round a note's tenth the other
    way)."""
    data = json.loads(report_json)
    return {str(r["name"]): float(r["predicted"]) / float(r["published"]) - 1.0 for r in data["rows"]}
