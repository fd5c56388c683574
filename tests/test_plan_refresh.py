"""`python -m par3d.plan.validation --refresh` (plan/refresh.py): the rewriting of generated doc blocks and of rows'
bounds and notes, checked on small inputs (the docs' blocks themselves are held to the planner's output by
test_plan_published.py, test_plan_leave_one_out.py and test_plan_moe_layers.py)."""

from __future__ import annotations

import os
import tomllib

import pytest

from par3d.plan import refresh, validation

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_every_generated_block_is_marked_once_in_its_doc() -> None:
    for name, doc in refresh.BLOCKS.items():
        with open(os.path.join(ROOT, doc), encoding="utf-8") as fh:
            text = fh.read()
        begin, end = refresh.BEGIN.format(name=name), refresh.END.format(name=name)
        assert text.count(begin) == 1 and text.count(end) == 1, (doc, name)
        assert text.index(begin) < text.index(end)


def test_repo_root_is_this_checkout() -> None:
    assert os.path.samefile(refresh.repo_root(), ROOT)


def test_replace_block_replaces_only_between_the_markers() -> None:
    text = "intro\n<!-- generated: t -->\n| a |\n|---|\n| 1 |\n<!-- end generated: t -->\n\noutro\n"
    new, changed = refresh.replace_block(text, "t", "| a |\n|---|\n| 2 |")
    assert changed and new == text.replace("| 1 |", "| 2 |")
    same, changed = refresh.replace_block(new, "t", "| a |\n|---|\n| 2 |\n")
    assert not changed and same == new


@pytest.mark.parametrize("text", ["no markers", "<!-- generated: t -->\n<!-- generated: t -->\n"
                                  "<!-- end generated: t -->", "<!-- end generated: t -->\n<!-- generated: t -->"])
def test_replace_block_refuses_a_missing_doubled_or_reversed_block(text: str) -> None:
    with pytest.raises(ValueError, match="generated block 't'"):
        refresh.replace_block(text, "t", "x")


def test_bound_and_quote_follow_the_published_test() -> None:
    # test_row_within_its_bound: a bound is |error| rounded up to the hundredth; the note quotes f"{error:+.1%}"
    assert refresh.bound_of(0.139) == 0.14 and refresh.bound_of(-0.2071) == 0.21 and refresh.bound_of(0.12) == 0.12
    assert refresh.quoted(0.1394) == "+13.9 %" and refresh.quoted(-0.2071) == "-20.7 %"
    for e in (0.1001, 0.139, -0.2999, 0.45):
        assert refresh.bound_of(e) - abs(e) < 0.01 + 1e-9 and refresh.bound_of(e) >= abs(e)


def _miss(error_pct: str, bound: float) -> dict[str, object]:
    return {"name": "r", "bound": bound, "note": f"a miss at {error_pct} since issue 12's first round (x)"}


def test_a_miss_that_has_not_moved_keeps_its_note() -> None:
    assert refresh.note_update(_miss("+13.9 %", 0.14), 0.1391, None, "n", "why") is None
    # the same quote, a loose bound: the bound is tightened, the note kept
    row = _miss("+13.9 %", 0.16)
    assert refresh.note_update(row, 0.1391, None, "n", "why") == (0.14, row["note"])


def test_a_miss_that_moved_dates_the_move_and_keeps_its_history() -> None:
    row = _miss("+13.9 %", 0.14)
    bound, note = refresh.note_update(row, 0.171, 0.1391, "forty-eighth", "facts read") or (None, None)
    assert bound == 0.18
    assert note == ("a miss at +17.1 % since issue 12's forty-eighth round (facts read); +13.9 % before; before that: "
                    + str(row["note"]))
    # without `before`, the old note's own quote is the error before
    _, note = refresh.note_update(row, 0.171, None, "forty-eighth", "facts read") or (None, None)
    assert note is not None and "; +13.9 % before;" in note


def test_a_miss_now_within_drops_its_bound() -> None:
    row = _miss("-12.1 %", 0.13)
    bound, note = refresh.note_update(row, -0.094, -0.121, "forty-eighth", "facts read") or (1.0, None)
    assert bound is None
    assert note is not None and note.startswith("within since issue 12's forty-eighth round (-9.4 %; facts read), "
                                                "a miss at -12.1 % before; before that: a miss at -12.1 %")


def test_a_new_miss_needs_the_error_before() -> None:
    row = {"name": "r"}
    assert refresh.note_update(row, 0.05, None, "n", "why") is None
    with pytest.raises(ValueError, match="r: a new miss at \\+11.0 %.*--before"):
        refresh.note_update(row, 0.11, None, "n", "why")
    assert refresh.note_update(row, 0.11, 0.094, "n", "why") == (
        0.11, "a miss at +11.0 % since issue 12's n round (why); +9.4 % before")
    old = {"name": "r", "note": "within since issue 12's m round (...)"}
    assert refresh.note_update(old, -0.11, -0.094, "n", "why") == (
        0.11, "a miss at -11.0 % since issue 12's n round (why); -9.4 % before; before that: "
              "within since issue 12's m round (...)")


TOML = '''# a header comment

# ---- block one
[[row]]
name = "a"
published = 10
note = "old \\"quoted\\" note"
bound = 0.2
assumed = "x"

[[row]]
name = "b"
published = 5.5
assumed = "y"
# ---- block two, right after a row
[[row]]
name = "c"
published = 1
note = "stays"
bound = 0.3
'''


def test_rewrite_rows_sets_and_removes_bound_and_note_only() -> None:
    out = refresh.rewrite_rows(TOML, {"a": (None, "within since 'n' (\"q\")"), "b": (0.13, "a miss at +12.3 %")})
    rows = {r["name"]: r for r in tomllib.loads(out)["row"]}
    assert "bound" not in rows["a"] and rows["a"]["note"] == "within since 'n' (\"q\")" and rows["a"]["assumed"] == "x"
    assert rows["b"]["bound"] == 0.13 and rows["b"]["note"] == "a miss at +12.3 %" and rows["b"]["published"] == 5.5
    assert rows["c"] == {"name": "c", "published": 1, "note": "stays", "bound": 0.3}
    assert "# ---- block two, right after a row" in out and out.startswith("# a header comment")
    # the lines go after `published`, as the rows have them
    b = out[out.index('name = "b"'):]
    assert b.index("published = 5.5") < b.index("note = ") < b.index("bound = ") < b.index('assumed = "y"')
    with pytest.raises(ValueError, match="rows not found"):
        refresh.rewrite_rows(TOML, {"zz": (None, None)})


def test_refresh_flags_are_refused_alone_and_with_other_modes(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--check"], ["--before", "x.json"], ["--refresh", "--software"], ["--refresh", "--rows", "mlperf"],
                 ["--refresh", "--json"]):
        with pytest.raises(SystemExit) as exc:
            validation.main(argv)
        assert exc.value.code == 2, argv
    assert "--refresh" in capsys.readouterr().err


def test_rewrite_rows_finds_a_rows_lines_past_a_comment_block() -> None:
    # TOML keeps a row's table open across comments: a note written after the next block's comment is the row's
    text = '[[row]]\nname = "a"\npublished = 1\n\n# ---- the next block\nbound = 0.2\nnote = "old"\n\n[[row]]\nname = "b"\n'
    out = refresh.rewrite_rows(text, {"a": (0.3, "new")})
    rows = {r["name"]: r for r in tomllib.loads(out)["row"]}
    assert rows["a"] == {"name": "a", "published": 1, "note": "new", "bound": 0.3} and "# ---- the next block" in out
