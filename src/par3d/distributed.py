"""Start-up: run a function on N ranks, under torchrun or as a local spawn.

Two ways in, one code path afterwards:

- under a launcher (torchrun, SLURM + torchrun, ...) the environment already names this process's
  RANK, WORLD_SIZE and LOCAL_RANK; `run_main` initialises the process group from it and runs the
  function in *this* process;
- otherwise `launch` spawns `nproc` local processes, gives each the same environment torchrun would,
  and collects their return values in the parent.  This is how the tests run 4 "GPUs" on a laptop.

The backend follows the hardware: NCCL with one GPU per rank where CUDA is available, gloo on the
CPU otherwise, so the same script runs unchanged on both.

Failures are the hard part of multi-process code, so `launch` is strict about them: the first rank
that raises, dies from a signal or exits non-zero makes the parent stop every other rank (SIGTERM,
then SIGKILL) and raise one `RankFailure` naming that rank and its error.  A rank blocked in a
collective whose peer died is therefore stopped within moments, not when the collective's timeout
(minutes) finally fires.  Nothing is printed twice: ranks do not print their tracebacks, the parent
prints nothing; the failure carries the text (`str(e)` one line, `e.traceback` in full).

The function given to `launch` must be picklable, i.e. defined at module level (not a lambda or a
closure), and so must its arguments and return value.  Children are started with the 'spawn'
method, so the script that calls `launch` must guard its entry point with
`if __name__ == "__main__":`.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import pickle
import secrets
import signal
import socket
import sys
import time
import traceback as tb
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import connection as mp_connection
from multiprocessing import get_context
from typing import Any

import torch
import torch.distributed as dist

# Variables torchrun sets for every rank; their presence means we run under a launcher.
_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

# How long a SIGTERM'd rank may take to go before it gets SIGKILL.
_TERM_GRACE_S = 3.0
DEATH_GRACE_S = 1.0  # after a reported error, how long to look for the rank death that may have caused it


class RankFailure(RuntimeError):
    """A rank of a launched world failed; `rank` is the first one that did (-1: the whole world).

    `error` is that rank's error text (the last line(s) of its traceback, or how the process ended:
    "killed by signal SIGKILL", "exited with code 1", "timed out after 60 s"), `traceback` its full
    traceback when it raised a Python exception.
    """

    def __init__(self, rank: int, error: str, traceback: str | None = None) -> None:
        self.rank = rank
        self.error = error
        self.traceback = traceback
        first_line = next((line for line in error.splitlines() if line.strip()), error)
        who = f"rank {rank}" if rank >= 0 else "world"
        super().__init__(f"{who} failed: {first_line.strip()}")

    def __reduce__(self) -> tuple[Any, ...]:
        # The default reduction would call RankFailure(message): keep the fields instead.
        return (type(self), (self.rank, self.error, self.traceback))


# --------------------------------------------------------------------------- environment helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it, so parallel suites differ)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_launcher() -> bool:
    """True when torchrun (or an equivalent launcher) has set this process's rank environment."""
    return all(k in os.environ for k in _LAUNCHER_VARS)


def backend_and_device(local_rank: int) -> tuple[str, torch.device]:
    """NCCL on this rank's GPU where CUDA is available, gloo on the CPU otherwise."""
    if torch.cuda.is_available():
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def init_process_group(
    rank: int, world_size: int, local_rank: int, timeout_s: float, threads: int = 1
) -> torch.device:
    """Join the default process group (env://: MASTER_ADDR/MASTER_PORT must be set); return the device.

    `timeout_s` bounds every collective: a rank waiting longer for its peers raises instead of hanging.
    """
    backend, device = backend_and_device(local_rank)
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        # Pin the GPU before NCCL creates its communicator, so each rank talks from its own device.
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    else:
        # N ranks share the CPU cores: one intra-op thread each unless asked otherwise, or the
        # ranks' thread pools oversubscribe the machine and every collective waits on the slowest.
        torch.set_num_threads(threads)
        _tight_timer_slack()
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
        **kwargs,
    )
    return device


def _tight_timer_slack() -> None:
    """Ask Linux to wake this thread (and the threads it starts later, gloo's among them) on time.

    By default a sleeping thread may be woken up to 50 us late, so that the kernel can batch
    wake-ups; a pipeline hop is several such wake-ups.  Harmless where unsupported."""
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK: 1 ns
    except (OSError, AttributeError):
        pass


def is_rank0() -> bool:
    """True on global rank 0, and in a process that is not part of a process group."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def shutdown() -> None:
    """Destroy the default process group if there is one (safe to call twice)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _finish() -> None:
    # Every rank reaches this point before any leaves: rank 0 hosts the rendezvous store, and a
    # rank 0 that exits early would make the slower ranks' tear-down fail.
    dist.barrier()
    shutdown()


# --------------------------------------------------------------------------- under a launcher


def run_main(fn: Callable[..., Any], nproc: int, args: tuple = (), **kw: Any) -> list[Any] | Any:
    """Run `fn(*args)` on every rank: in this process under torchrun, else on `nproc` local processes.

    Under a launcher the world size is the launcher's (`nproc` is ignored), this process's return
    value is returned, and of `launch`'s keywords only `timeout_s`, `threads` and `env` apply.
    Otherwise this is `launch(fn, nproc, args, **kw)` and returns the list of all ranks' values.
    """
    if not under_launcher():
        return launch(fn, nproc, args, **kw)
    os.environ.update(kw.get("env") or {})
    init_process_group(
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ["LOCAL_RANK"]),
        timeout_s=kw.get("timeout_s", 60.0),
        threads=kw.get("threads", 1),
    )
    # On an exception the group is left as is: the launcher tears the failed world down.
    result = fn(*args)
    _finish()
    return result


# --------------------------------------------------------------------------- local spawn: child


@dataclass(frozen=True)
class _RankSpec:
    rank: int
    world_size: int
    master_port: int
    timeout_s: float
    threads: int
    env: dict[str, str]
    parent_pid: int


def _die_with_parent(parent_pid: int) -> None:
    # If the parent is killed outright it cannot stop us, and a rank blocked in a collective would
    # linger until the collective times out.  Linux can deliver SIGKILL when the parent goes.
    if not sys.platform.startswith("linux"):
        return
    try:
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _error_text(exc: BaseException) -> str:
    return "".join(tb.format_exception_only(type(exc), exc)).strip()


def _rank_main(spec: _RankSpec, payload: bytes, conn: mp_connection.Connection) -> None:
    """Entry point of a spawned rank: set up the environment torchrun would, run fn, report back.

    Messages to the parent: ("ok", value) or ("error", error_text, traceback_text, monotonic time).
    """
    _die_with_parent(spec.parent_pid)
    # torch is imported by now; OMP_NUM_THREADS is for what starts later (libraries, subprocesses),
    # torch's own pool is sized by init_process_group.
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(spec.master_port),
        RANK=str(spec.rank),
        WORLD_SIZE=str(spec.world_size),
        LOCAL_RANK=str(spec.rank),
        LOCAL_WORLD_SIZE=str(spec.world_size),
        OMP_NUM_THREADS=str(spec.threads),
    )
    os.environ.update(spec.env)
    try:
        init_process_group(spec.rank, spec.world_size, spec.rank, spec.timeout_s, spec.threads)
        # Unpickled only now, so that importing fn's module happens with the environment in place.
        fn, args = pickle.loads(payload)
        result = fn(*args)
        dist.barrier()  # every rank finished before any leaves (as in _finish)
        # plain pickle: tensors travel by value (torch's multiprocessing pickler would pass
        # shared-memory handles that die with this process)
        message = pickle.dumps(("ok", result))
    except BaseException as exc:  # SystemExit and KeyboardInterrupt in a rank are failures too
        try:
            conn.send_bytes(pickle.dumps(("error", _error_text(exc), tb.format_exc(), time.monotonic())))
        except OSError:  # the parent is gone; nobody is left to tell
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter tear-down: destructors of a broken process group can block, and the
        # parent stops the other ranks anyway.
        os._exit(1)
    # The result is delivered before the tear-down: every rank has finished (the barrier), so how
    # the process group's destruction ends cannot change it.  Torch's and gloo's C++ threads now
    # and then abort a process on its way out ("terminate called without an active exception",
    # SIGABRT); the parent then keeps the result and only warns (see _wait).  The C++ part of the
    # interpreter's tear-down (static destructors, the same threads again) is skipped altogether.
    conn.send_bytes(message)
    conn.close()
    try:
        shutdown()
        # Python's own exit handlers still run (multiprocessing unregisters the semaphores this
        # process made — tqdm's lock — which the resource tracker would otherwise report leaked)
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# --------------------------------------------------------------------------- local spawn: parent


def _signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def _stop(procs: list[Any]) -> None:
    """SIGTERM every live process, SIGKILL those still alive after a grace period, reap all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _TERM_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()


def _wait(procs: list[Any], conns: list[mp_connection.Connection], wall_timeout_s: float | None) -> list[Any]:
    """Collect every rank's value; raise RankFailure on the first failure (the caller stops the rest)."""
    nproc = len(procs)
    deadline = None if wall_timeout_s is None else time.monotonic() + wall_timeout_s
    results: dict[int, Any] = {}
    open_conns = dict(enumerate(conns))
    running = {p.sentinel: rank for rank, p in enumerate(procs)}

    while running:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = mp_connection.wait([*open_conns.values(), *running], timeout)
        if not ready:
            late = ", ".join(str(r) for r in sorted(running.values()))
            raise RankFailure(-1, f"timed out after {wall_timeout_s:g} s (ranks not finished: {late})")

        # Read messages before looking at exits: a rank that reported an error and then exited
        # failed with that error, not with "exited with code 1".
        errors: list[tuple[float, RankFailure]] = []
        for rank, conn in list(open_conns.items()):
            while rank in open_conns and conn.poll():
                try:
                    msg = pickle.loads(conn.recv_bytes())
                except EOFError:
                    del open_conns[rank]
                    break
                if msg[0] == "ok":
                    results[rank] = msg[1]
                else:
                    _, error, trace, t = msg
                    errors.append((t, RankFailure(rank, error, trace)))

        # Ranks that ended without reporting (killed by a signal, os._exit, ...).  Such a death is
        # the cause of whatever its peers report in the same round (they lost a connection), so it
        # takes precedence; otherwise the earliest reported error wins.
        deaths: list[RankFailure] = []
        for sentinel in [s for s in ready if s in running]:
            rank = running.pop(sentinel)
            p = procs[rank]
            p.join()
            if rank in results:
                if p.exitcode != 0:  # in the tear-down after delivering its result (_rank_main)
                    how = (f"signal {_signal_name(p.exitcode)}" if p.exitcode is not None and p.exitcode < 0
                           else f"code {p.exitcode}")
                    print(f"par3d: rank {rank} finished, then its process ended with {how} while tearing "
                          "down; its result is kept", file=sys.stderr)
                continue
            if any(f.rank == rank for _, f in errors):
                continue
            if p.exitcode is not None and p.exitcode < 0:
                deaths.append(RankFailure(rank, f"killed by signal {_signal_name(p.exitcode)}"))
            else:
                what = "" if p.exitcode else " without returning a result"
                deaths.append(RankFailure(rank, f"exited with code {p.exitcode}{what}"))
        if errors and not deaths:
            # A peer's "connection closed" can be read before the death that caused it shows (the
            # killed rank's sentinel fires a moment later): give the others a moment to show one.
            t_end = time.monotonic() + DEATH_GRACE_S
            while running and (left := t_end - time.monotonic()) > 0 and not deaths:
                for sentinel in mp_connection.wait(list(running), left):
                    rank = running.pop(sentinel)
                    procs[rank].join()
                    code = procs[rank].exitcode
                    if code is not None and code < 0 and rank not in results:  # a signal: never reports
                        deaths.append(RankFailure(rank, f"killed by signal {_signal_name(code)}"))
        if deaths:
            raise min(deaths, key=lambda f: f.rank)
        if errors:
            raise min(errors, key=lambda e: e[0])[1]

    assert len(results) == nproc, results
    return [results[r] for r in range(nproc)]


def _address_in_use(failure: RankFailure) -> bool:
    text = failure.error + (failure.traceback or "")
    return "EADDRINUSE" in text or "address already in use" in text.lower()


def launch(
    fn: Callable[..., Any],
    nproc: int,
    args: tuple = (),
    *,
    timeout_s: float = 60.0,
    threads: int = 1,
    env: dict[str, str] | None = None,
    wall_timeout_s: float | None = None,
) -> list[Any]:
    """Run `fn(*args)` on `nproc` freshly spawned local ranks; return their values ordered by rank.

    `fn` must be a module-level function; it finds its rank with `torch.distributed.get_rank()`.
    `timeout_s` is the process group's timeout for each collective, `threads` the intra-op threads
    of each CPU rank, `env` extra environment variables for the ranks, and `wall_timeout_s` (None:
    no limit) a watchdog on the whole world.  Raises RankFailure for the first rank that fails,
    after every rank has been stopped.
    """
    if nproc < 1:
        raise ValueError(f"nproc={nproc} must be >= 1")
    if torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise ValueError(
            f"nproc={nproc} ranks need one GPU each, but {torch.cuda.device_count()} are visible"
        )
    # Pickle here, not in the children: an unpicklable fn (a lambda, a closure) fails at once, clearly.
    payload = pickle.dumps((fn, tuple(args)))

    try:
        return _launch_once(payload, nproc, timeout_s, threads, env or {}, wall_timeout_s)
    except RankFailure as failure:
        # free_port's port can be taken by another program before rank 0 binds it: retry once.
        if not _address_in_use(failure):
            raise
    return _launch_once(payload, nproc, timeout_s, threads, env or {}, wall_timeout_s)


def _launch_once(
    payload: bytes,
    nproc: int,
    timeout_s: float,
    threads: int,
    env: dict[str, str],
    wall_timeout_s: float | None,
) -> list[Any]:
    ctx = get_context("spawn")  # fork would copy the parent's threads and CUDA state: unsafe
    port = free_port()
    procs: list[Any] = []
    conns: list[mp_connection.Connection] = []
    # the world's id: its ranks' shared-memory files carry it, so they can be removed below however
    # the world ended (a rank SIGKILLed, or Ctrl-C, before the ranks removed them themselves)
    run_id = os.environ.get("PAR3D_RUN_ID") or secrets.token_hex(4)
    tracker_was_running = _tracker_running()
    try:
        for rank in range(nproc):
            recv_end, send_end = ctx.Pipe(duplex=False)
            spec = _RankSpec(rank, nproc, port, timeout_s, threads, dict(env, PAR3D_RUN_ID=run_id), os.getpid())
            p = ctx.Process(target=_rank_main, args=(spec, payload, send_end), name=f"par3d-rank{rank}")
            p.start()
            send_end.close()  # the child holds its own copy; ours would hide its EOF
            procs.append(p)
            conns.append(recv_end)
        return _wait(procs, conns, wall_timeout_s)
    finally:
        # On success the ranks are already gone; on a failure, a timeout or Ctrl-C, stop them all.
        _stop(procs)
        for c in conns:
            c.close()
        from par3d.pipeline.shm import remove_files

        remove_files(run_id + "-")
        if not tracker_was_running:
            _stop_tracker()


def _tracker_running() -> bool:
    from multiprocessing import resource_tracker

    return getattr(resource_tracker._resource_tracker, "_pid", None) is not None


def _stop_tracker() -> None:
    """Stop the resource tracker that spawning the ranks started, now that they are gone: else it
    outlives the launcher by a moment (it exits when it notices the last writer has gone)."""
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)  # Python >= 3.11.? has it
    if stop is not None:
        try:
            stop()
        except (OSError, ChildProcessError):
            pass
