"""Clocks that mean the same on a CPU and on a GPU.

On a GPU, torch returns from a kernel launch long before the kernel has run, so a host clock read
after a forward measures the launch, not the work: step times, the pipeline timeline and its
bubble would all be launch times.  Two cures, used where each fits:
  * `now(device)` / `wall(device)`: synchronise the device, then read the host clock — for a
    step's time or one blocking operation (a synchronisation per reading is negligible there);
  * `Marks`: CUDA events recorded in the stream between actions, resolved to wall-clock times
    after the step (one synchronisation per step), so the pipeline's actions are timed where
    they ran on the device without stalling the host between them.
On a CPU both are the plain host clocks (no synchronisation exists or is needed).

Every place that measures time in the runtime (train.py's step time, pipeline/runtime.py's
action timeline, comm.py's counters: `stamp` / `seconds`, events resolved once a step) goes
through here.  None of it has run on a GPU yet
(docs/reliability.md, "The GPU path").
"""

from __future__ import annotations

import time
from typing import Any

import torch


def sync(device: torch.device | None) -> None:
    """Wait until every kernel queued on `device` has run (nothing to do on a CPU)."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device | None = None) -> float:
    """Monotonic seconds once `device`'s queued work is done (time.perf_counter)."""
    sync(device)
    return time.perf_counter()


def wall(device: torch.device | None = None) -> float:
    """Wall-clock seconds (comparable across ranks) once `device`'s queued work is done."""
    sync(device)
    return time.time()


def stamp(device: torch.device | None) -> Any:
    """A point in `device`'s stream: a recorded CUDA event on a GPU (nothing waits for it), the
    host's time.perf_counter() on a CPU.  `seconds(a, b)` is the time between two stamps."""
    if device is not None and device.type == "cuda":
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e
    return time.perf_counter()


def seconds(a: Any, b: Any) -> float:
    """Seconds between stamps `a` and `b` (on a GPU this waits until `b` has been reached)."""
    if isinstance(a, float):
        return b - a
    b.synchronize()
    return a.elapsed_time(b) / 1e3


class Marks:
    """Wall-clock timestamps of points in a device's stream.  `start()` once, `mark()` at every
    point (a float on a CPU, a recorded CUDA event on a GPU), `times(marks)` after the last one:
    seconds since the epoch, comparable across ranks (the events are placed relative to an event
    recorded, after a synchronisation, at a known wall-clock time)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self._t0 = 0.0
        self._e0: Any = None

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self._e0 = torch.cuda.Event(enable_timing=True)
            self._e0.record()
        self._t0 = time.time()

    def mark(self) -> Any:
        if not self.cuda:
            return time.time()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def times(self, marks: list[Any]) -> list[float]:
        if not self.cuda:
            return list(marks)
        torch.cuda.synchronize(self.device)
        return [self._t0 + self._e0.elapsed_time(e) / 1e3 for e in marks]  # elapsed_time: milliseconds
