"""The seam through which tests inject faults into a training run (docs/reliability.md).

The training loop knows nothing about tests: it calls the four methods of a `RunHooks` object at
fixed points (a step starts, the loss scale of a step, just before a checkpoint save, in the middle
of a save).  `RunHooks` does nothing; `FaultInjector` is the implementation the failure tests pass,
either in `RunOptions(faults=...)` (in-process runs) or, for runs started as a `par3d train`
subprocess, through environment variables read ONCE when a rank starts:

    PAR3D_TEST_{KILL,RAISE,HANG}_RANK_AT_STEP="RANK:STEP"       at the start of step STEP (0-based)
    PAR3D_TEST_{KILL,RAISE,HANG}_RANK_AT_STEP="RANK:STEP:save"  in the middle of the checkpoint save
                                                                after step STEP (the temporary
                                                                folder exists, nothing is final)

makes global rank RANK SIGKILL itself, raise, or sleep forever.  Never set them in a real run.
"""

from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Literal

FaultKind = Literal["kill", "raise", "hang"]
_ENV = {"kill": "PAR3D_TEST_KILL_RANK_AT_STEP", "raise": "PAR3D_TEST_RAISE_RANK_AT_STEP",
        "hang": "PAR3D_TEST_HANG_RANK_AT_STEP"}


class RunHooks:
    """Where the training loop can be disturbed; every method is a no-op here."""

    def step_started(self, rank: int, step: int) -> None:
        """At the start of step `step` on global rank `rank`."""

    def loss_scale(self, step: int, scale: float) -> float:
        """The factor the step's per-token losses are multiplied by (1 / global tokens)."""
        return scale

    def before_save(self, rank: int, step: int, dpar: Any) -> None:
        """Before the checkpoint save after step `step` (`dpar`: the rank's DataParallel)."""

    def in_save(self, rank: int, step: int) -> None:
        """In the middle of that save, on every rank (the temporary folder exists)."""


@dataclass(frozen=True)
class Fault:
    """Global rank `rank` does `kind` at step `step`: at its start ("step") or mid-save ("save")."""

    kind: FaultKind
    rank: int
    step: int
    where: Literal["step", "save"] = "step"

    def fire(self) -> None:
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "raise":
            raise RuntimeError(f"injected failure on rank {self.rank} at step {self.step} ({_ENV['raise']})")
        while True:  # hang
            time.sleep(1)


@dataclass(frozen=True)
class FaultInjector(RunHooks):
    """TEST-ONLY: process faults, a poisoned loss, poisoned weights before a save."""

    faults: tuple[Fault, ...] = field(default_factory=tuple)
    nan_loss_at_step: int | None = None  # the step's loss becomes NaN (the update must be skipped)
    nan_master_at_step: int | None = None  # rank 0's first master weight becomes NaN before that save

    @classmethod
    def from_env(cls, environ: Any = None) -> FaultInjector | None:
        """The faults named by PAR3D_TEST_*_RANK_AT_STEP, or None when none is set."""
        environ = os.environ if environ is None else environ
        faults = []
        for kind, var in _ENV.items():
            spec = environ.get(var)
            if spec:
                r, s, *w = spec.split(":")
                faults.append(Fault(kind, int(r), int(s), w[0] if w else "step"))  # type: ignore[arg-type]
        return cls(tuple(faults)) if faults else None

    def _fire(self, rank: int, step: int, where: str) -> None:
        for f in self.faults:
            if (f.rank, f.step, f.where) == (rank, step, where):
                f.fire()

    def step_started(self, rank: int, step: int) -> None:
        self._fire(rank, step, "step")

    def loss_scale(self, step: int, scale: float) -> float:
        return math.nan if step == self.nan_loss_at_step else scale

    def before_save(self, rank: int, step: int, dpar: Any) -> None:
        if step == self.nan_master_at_step and rank == 0:
            dpar.bufs[0].master[0] = math.nan

    def in_save(self, rank: int, step: int) -> None:
        self._fire(rank, step, "save")
