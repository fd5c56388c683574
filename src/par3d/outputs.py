"""Can the run write where it was told to?  Checked before any process starts.

A run writes its metrics from the first step, its checkpoints every --save-every steps and its
trace and report at the end.  Finding at the end that `--trace-out` is not writable loses the whole
run's results, so each output is tried up front: a folder is created (with its parents) and a probe
file written and removed in it; a file's folder likewise, and the file itself opened for appending.
Folders the check created are removed again (the run creates them when it writes), except under a
launcher, where every rank checks at once and one rank's clean-up could race another's probe.

Pure (no torch).  Each problem names the flag, the value, what failed and a fix.
"""

from __future__ import annotations

import errno
import os
import tempfile


def _missing_parents(path: str) -> list[str]:
    """`path` and those of its parents that do not exist, deepest first."""
    out = []
    p = os.path.abspath(path)
    while not os.path.exists(p):
        out.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return out


def _why(e: OSError) -> str:
    return e.strerror or errno.errorcode.get(e.errno or 0, str(e))


def _probe_folder(flag: str, path: str, created: list[str]) -> str | None:
    if os.path.exists(path) and not os.path.isdir(path):
        return (f"{flag}={path!r} is an existing file, not a folder; give a folder (it is created "
                f"when missing)")
    missing = _missing_parents(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        created.extend(p for p in missing if os.path.isdir(p))
        where = next((p for p in reversed(missing) if not os.path.isdir(p)), path)
        return f"{flag}={path!r}: cannot create the folder {where!r} ({_why(e)}); give a folder you can write to"
    created.extend(missing)
    try:
        fd, probe = tempfile.mkstemp(prefix=".par3d-write-probe-", dir=path)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        return f"{flag}={path!r}: cannot write in this folder ({_why(e)}); give a folder you can write to"
    return None


def _probe_file(flag: str, path: str, created: list[str]) -> str | None:
    if os.path.isdir(path):
        return f"{flag}={path!r} is a folder; give a file name, e.g. {os.path.join(path, 'metrics.jsonl')!r}"
    folder = os.path.dirname(path) or "."
    problem = _probe_folder(flag, folder, created)
    if problem:
        return problem
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        return f"{flag}={path!r}: cannot write this file ({_why(e)}); give a file you can write"
    if not existed:
        os.unlink(path)
    return None


def check_outputs(folders: list[tuple[str, str]], files: list[tuple[str, str]],
                  clean_up: bool = True) -> list[str]:
    """Problems with the output `folders` and `files`, each given as (flag, path); [] when every
    one can be written.  `clean_up`: remove the folders this check created."""
    created: list[str] = []
    problems: list[str] = []
    failed: list[str] = []  # an output inside a folder already reported is not reported again
    try:
        for kind, flag, path in [*(("dir", f, p) for f, p in folders), *(("file", f, p) for f, p in files)]:
            full = os.path.abspath(path)
            if any(full == f or full.startswith(f + os.sep) for f in failed):
                continue
            problem = (_probe_folder if kind == "dir" else _probe_file)(flag, path, created)
            if problem:
                problems.append(problem)
                failed.append(full)
    finally:
        if clean_up:
            for p in sorted(set(created), key=len, reverse=True):  # deepest first
                try:
                    os.rmdir(p)
                except OSError:
                    pass
    return problems
