"""Which machine is this: what a hardware file records (`par3d calibrate`) and checks on use.

A calibration describes the host it ran on; used on another one its predictions can be tens of per
cent off without any sign (a 2-core VM of another CPU model predicted every layout 31-69 % too slow).
So `par3d calibrate` records the CPU model and core count (or the GPU's name), the torch version and
the date, and `par3d plan/train --hardware` and `par3d bench fidelity` warn in one line when the
file describes another host.  Imports no torch (the planner uses it): the torch version is read
from the installed package's metadata, a GPU's name from the NVIDIA driver's /proc entries.
"""

from __future__ import annotations

import datetime
import glob
import os
import platform
import sys
from importlib import metadata
from typing import Any


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def machine_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def gpu_names() -> list[str]:
    """GPU models the NVIDIA driver lists (no CUDA initialisation)."""
    names = []
    for path in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith("Model:"):
                        names.append(line.split(":", 1)[1].strip())
        except OSError:
            continue
    return names


def torch_version() -> str:
    if "torch" in sys.modules:  # the running one (a test may have a different one installed)
        return str(sys.modules["torch"].__version__)
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


def describe(gpu: str | None = None) -> dict[str, Any]:
    """This host as a hardware file records it; `gpu` is the device calibrated (torch's name)."""
    gpus = gpu_names()
    return {"cpu": cpu_name(), "cores": machine_cores(), "gpu": gpu or (gpus[0] if gpus else None),
            "torch": torch_version(), "python": platform.python_version(),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def _short_torch(v: str) -> str:
    return v.split("+")[0]


def mismatch(recorded: dict[str, Any] | None, here: dict[str, Any] | None = None) -> list[str]:
    """What differs between the host a file was calibrated on and this one (empty: the same)."""
    if not recorded:
        return []
    here = here or describe()
    diffs = []
    if recorded.get("gpu") or here.get("gpu"):
        if recorded.get("gpu") and here.get("gpu") and recorded["gpu"] not in here["gpu"] \
                and here["gpu"] not in recorded["gpu"]:
            diffs.append(f"GPU {recorded['gpu']} (here {here['gpu']})")
    if recorded.get("cpu") and recorded.get("cpu") != here.get("cpu"):
        diffs.append(f"CPU {recorded['cpu']} (here {here.get('cpu')})")
    if recorded.get("cores") and recorded.get("cores") != here.get("cores"):
        diffs.append(f"{recorded['cores']} cores (here {here.get('cores')})")
    if recorded.get("torch") and _short_torch(str(recorded["torch"])) != _short_torch(str(here.get("torch"))):
        diffs.append(f"torch {recorded['torch']} (here {here.get('torch')})")
    return diffs


def warn_if_other_host(path: str, extra: dict[str, Any], prog: str = "par3d") -> str | None:
    """Print (to stderr) and return one line when the hardware file at `path` describes another
    host; None when it is this one or records no host."""
    host = extra.get("host")
    if not isinstance(host, dict):  # none recorded, or not a table of them: nothing to compare
        return None
    diffs = mismatch(host)
    if not diffs:
        return None
    when = host.get("date", "an unknown date")
    line = (f"{prog}: warning: {path} was calibrated on another host ({'; '.join(diffs)}; {when}): its "
            f"predictions may be far off here; run `par3d calibrate` on this machine")
    print(line, file=sys.stderr)
    return line


__all__ = ["cpu_name", "describe", "gpu_names", "machine_cores", "mismatch", "torch_version", "warn_if_other_host"]
