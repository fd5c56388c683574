"""Pipeline timelines as a Chrome/Perfetto trace, a Gantt chart PNG or an ASCII Gantt.

Inputs are labelled event lists, e.g. ``{"measured": [...], "simulated": [...]}``, in the one event
format shared by the simulator and the runtime, so predicted and measured runs sit side by side.

No torch here, and matplotlib is imported only when a PNG is drawn (and then only its Agg canvas,
never pyplot, so no GUI backend or global state is touched).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from par3d.pipeline.simulate import Event, Timeline

# Colour-blind-friendly (Okabe-Ito) colours per action kind.
COLOURS = {"F": "#0072B2", "B": "#D55E00", "BI": "#E69F00", "BW": "#009E73"}
_LETTERS = {"F": "F", "B": "B", "BI": "I", "BW": "W"}


def _label(e: Event) -> str:
    return f"{e.kind} s{e.stage} mb{e.microbatch}"


def chrome_trace(timelines: dict[str, list[Event]]) -> dict:
    """Trace-event JSON (load it in https://ui.perfetto.dev or chrome://tracing).

    One process per source label and one thread per pipeline rank.  The trace format wants integer
    process ids, so each label gets an index and a ``process_name`` metadata record carrying the
    label (also present as ``args.source`` on every event).  Times are in microseconds.
    """
    out: list[dict] = []
    for pid, (label, events) in enumerate(timelines.items()):
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        for rank in sorted({e.rank for e in events}):
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": rank,
                        "args": {"name": f"pipeline rank {rank}"}})
        for e in events:
            out.append({
                "name": _label(e), "cat": e.kind, "ph": "X", "pid": pid, "tid": e.rank,
                "ts": e.start * 1e6, "dur": max(e.end - e.start, 0.0) * 1e6,
                "args": {"source": label, "kind": e.kind, "stage": e.stage, "microbatch": e.microbatch},
            })
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(timelines: dict[str, list[Event]], path: str) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(timelines), f)


def gantt_png(timelines: dict[str, list[Event]], path: str, title: str = "") -> None:
    """One panel per label, stacked; one row per rank (rank 0 on top); a box per action coloured by
    kind (lighter for odd model chunks of interleaved schedules), with its micro-batch number inside
    when the box is wide enough.

    Each panel has its own time axis: measured runs are in real seconds while simulated ones are in
    whatever unit the durations were given, so a shared axis would squash one of them.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    labels = list(timelines) or [""]
    n_ranks = [max((e.rank for e in timelines.get(lb, [])), default=0) + 1 for lb in labels]
    width_in = 12.0
    fig = Figure(figsize=(width_in, 1.0 + sum(0.45 * n + 0.8 for n in n_ranks)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(labels), 1, squeeze=False,
                        gridspec_kw={"height_ratios": [n + 1 for n in n_ranks]})[:, 0]
    for ax, label, ranks in zip(axes, labels, n_ranks):
        events = timelines.get(label, [])
        t0 = min((e.start for e in events), default=0.0)
        span = max((e.end for e in events), default=1.0) - t0 or 1.0
        # Roughly how many points a unit of time covers: decides whether a number fits in a box.
        pts_per_time = width_in * 72 * 0.8 / span
        for e in events:
            # Interleaved schedules: odd model chunks (stage // p) are drawn lighter.
            chunk = e.stage // ranks
            ax.barh(e.rank, e.end - e.start, left=e.start - t0, height=0.8, alpha=1.0 - 0.4 * (chunk % 2),
                    color=COLOURS.get(e.kind, "grey"), edgecolor="white", linewidth=0.5)
            if (e.end - e.start) * pts_per_time >= 6 * len(str(e.microbatch)) + 2:
                ax.text(e.start - t0 + (e.end - e.start) / 2, e.rank, str(e.microbatch),
                        ha="center", va="center", fontsize=7, color="white")
        ax.set_ylim(ranks - 0.5, -0.5)
        ax.set_yticks(range(ranks))
        ax.set_yticklabels([f"rank {r}" for r in range(ranks)])
        ax.set_xlim(0, span)
        ax.set_title(label, loc="left", fontsize=10)
        ax.set_xlabel("seconds" if label == "measured" else "time")
    kinds = sorted({e.kind for evs in timelines.values() for e in evs}, key=lambda k: list(COLOURS).index(k)
                   if k in COLOURS else len(COLOURS))
    axes[0].legend(handles=[Patch(color=COLOURS.get(k, "grey"), label=k) for k in kinds],
                   loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=max(len(kinds), 1), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _fill(row: list[str], a: int, b: int, text: str) -> None:
    """Write ``text`` into cells [a, b), truncated, padded with the kind letter."""
    cells = b - a
    if cells <= 0:
        return
    body = text if len(text) <= cells else text[0]
    body = body + text[0].lower() * (cells - len(body))
    row[a:b] = list(body)


def gantt_text(timeline: Timeline, width: int = 80) -> str:
    """ASCII Gantt: a row per rank, ``F3`` = forward of micro-batch 3 (I/W: input/weight backward),
    lower-case letters pad a box, ``.`` is idle.  Boxes too narrow for a number show the letter."""
    width = max(width - 9, 10)  # room for the "rank N |" prefix and the closing "|"
    span = timeline.makespan or 1.0
    scale = width / span
    rows = [["."] * width for _ in range(timeline.p)]
    for e in _by_start(timeline.events):
        a, b = round(e.start * scale), round(e.end * scale)
        b = max(b, a + 1) if e.end > e.start else b  # never let a real action vanish
        _fill(rows[e.rank], a, min(b, width), f"{_LETTERS.get(e.kind, '?')}{e.microbatch}")
    lines = [f"rank {r:<2}|" + "".join(row) + "|" for r, row in enumerate(rows)]
    lines.append(f"{'':7}0{'':{max(width - len(f'{span:g}') - 1, 0)}}{span:g}")
    if timeline.v > 1:
        lines.append(f"{'':7}(v={timeline.v} model chunks per rank; boxes do not show which chunk)")
    return "\n".join(lines)


def _by_start(events: Iterable[Event]) -> list[Event]:
    return sorted(events, key=lambda e: (e.start, e.rank))
