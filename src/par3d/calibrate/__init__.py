"""`par3d calibrate`: measure this machine and write a hardware file the planner reads.

Split by job: `probes` (torch measurements on this rank's device), `fits` (pure arithmetic from
points to the file's numbers), `run` (the whole calibration), `report` (summary and plot); the
command line is `par3d/commands/calibrate.py`.  Nothing here imports `par3d.bench`.
"""

from __future__ import annotations

from par3d.calibrate.fits import (
    fit_collective_sync,
    fit_collectives,
    fit_contention,
    fit_gemm,
    fit_link,
    fit_pipeline_hop,
    fit_point_sync,
    fit_primitives,
    lstsq,
    lstsq2,
    rel_rms,
    residual_overheads,
)
from par3d.calibrate.probes import collective_worker
from par3d.calibrate.report import plot, summary
from par3d.calibrate.run import calibrate

__all__ = ["calibrate", "collective_worker", "fit_collective_sync", "fit_collectives", "fit_contention", "fit_gemm", "fit_link",
           "fit_pipeline_hop", "fit_point_sync", "fit_primitives", "lstsq", "lstsq2", "plot", "rel_rms", "residual_overheads",
           "summary"]
