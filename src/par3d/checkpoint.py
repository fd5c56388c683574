"""Checkpoints: whole or absent, loadable under any layout, on torch.distributed.checkpoint.

A checkpoint is a folder `<out>/checkpoints/step-00000012/` (12 = steps done = the step a resumed
run starts at) holding

  .metadata, *.distcp   the tensor payload, written by torch.distributed.checkpoint (DCP):
                        FULL fp32 tensors under layout-independent global names —
                          model/<name>        master weights
                          exp_avg/<name>      Adam first moment
                          exp_avg_sq/<name>   Adam second moment
                          rng/<dp>.<pp>.<tp>  torch RNG state of each rank (rng_cuda/... on GPUs)
  manifest.json         written LAST: format marker, step, optimizer steps, layout, config,
                        versions, tensor shapes, and each file's size and CRC-32.

Whole or absent: a save writes into `.tmp-step-…/`, the manifest last, then renames the folder
into place (atomic on one filesystem).  A crash mid-save leaves only a `.tmp-` folder, which is
never loaded and which the next save removes.  A folder without a valid manifest, or whose files
do not match it, is refused with a one-line error.

Any layout loads any checkpoint: tensors are saved unsharded (TP slices gathered, ZeRO's owned slices of
weights, Adam state gathered over dp x cp, vocabulary padding dropped), and each rank of the loading run reads the
full tensors of the parameters it holds and cuts them exactly as initialisation does
(`shard_rows` with the Q|K|V stride, `shard_cols`, vocabulary padding); pipeline splits need
nothing, since names carry global block indices.

The checking half (`resolve`, `read_manifest`, `check_compatible`) imports no torch, so a bad
checkpoint is refused before any process starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from par3d.config import ConfigError, RunConfig

FORMAT = "par3d-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
# Model fields that fix the tensors' shapes or meaning.  Dropout may change on resume.
_MODEL_FIELDS = ("vocab", "seq_len", "layers", "hidden", "heads", "ffn_hidden", "tied_embeddings", "arch",
                 "kv_heads", "norm", "position", "max_positions", "gated_mlp", "activation", "bias")
# Training fields whose change makes a resumed run differ from the uninterrupted one: allowed
# (fine-tuning with another learning rate is legitimate) but reported.
_TRAIN_FIELDS = ("seed", "global_batch", "steps", "lr", "min_lr", "warmup", "weight_decay", "grad_clip",
                 "beta1", "beta2", "eps", "data")
# Parameters whose rows are the vocabulary: stored with exactly `vocab` rows (padding dropped).
# The same tuple as model.VOCAB_PARAMS (not imported: this module's checking half imports no torch).
_VOCAB_PARAMS = ("embedding.tok.weight", "head.weight")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be loaded: missing, foreign, incomplete, corrupt, or of another
    model.  A ConfigError, so it is reported like any other bad input; with one problem its text is
    that one line."""

    def __init__(self, problems: list[str] | str):
        problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(problems)
        if len(problems) == 1:
            self.args = (problems[0],)


# ---- names and folders (no torch) -------------------------------------------------------------------

def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def checkpoints_root(out: str) -> str:
    """Where a run with `--out OUT` keeps its checkpoints."""
    return os.path.join(out, "checkpoints")


def list_checkpoints(root: str) -> list[tuple[int, str]]:
    """(step, folder) of every `step-N` folder in `root`, oldest first (validity not checked)."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        if m and os.path.isdir(os.path.join(root, name)):
            found.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(found)


def _crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            crc = zlib.crc32(block, crc)
    return crc


def read_manifest(path: str, verify_files: bool = True) -> dict[str, Any]:
    """The manifest of checkpoint folder `path`, after checking that the folder is a whole par3d
    checkpoint (every file present, of the recorded size and CRC-32).  Raises CheckpointError."""
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist (or is not a folder)")
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        names = os.listdir(path)
        if ".metadata" in names or any(n.endswith(".distcp") for n in names):
            raise CheckpointError(f"checkpoint {path!r} is incomplete: it has tensor files but no {MANIFEST} "
                                  f"(its save did not finish); resume from an earlier checkpoint")
        raise CheckpointError(f"{path!r} is not a par3d checkpoint: it has no {MANIFEST}")
    try:
        with open(mpath, encoding="utf-8") as fh:
            man = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {path!r}: {MANIFEST} is unreadable or truncated ({e})") from None
    fmt = man.get("format") if isinstance(man, dict) else None
    if fmt != FORMAT:
        raise CheckpointError(f"{path!r} is not a par3d checkpoint: {MANIFEST} has format {fmt!r}, "
                              f"expected {FORMAT!r}")
    if man.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path!r} has format version {man.get('format_version')!r}; this "
                              f"par3d reads version {FORMAT_VERSION}")
    missing = [k for k in ("step", "optimizer_steps", "layout", "config", "tensors", "files") if k not in man]
    if missing:
        raise CheckpointError(f"checkpoint {path!r}: {MANIFEST} lacks {', '.join(missing)}")
    if verify_files:
        _verify_files(path, man["files"])
    return man


def _verify_files(path: str, files: Any) -> None:
    if not isinstance(files, dict) or not files:
        raise CheckpointError(f"checkpoint {path!r}: {MANIFEST} lists no files")
    for name, rec in files.items():
        fp = os.path.join(path, name)
        if not os.path.isfile(fp):
            raise CheckpointError(f"checkpoint {path!r} is incomplete: {name} is missing")
        try:
            want_bytes, want_crc = int(rec["bytes"]), int(rec["crc32"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"checkpoint {path!r}: {MANIFEST} entry for {name} is malformed") from None
        size = os.path.getsize(fp)
        if size != want_bytes:
            raise CheckpointError(f"checkpoint {path!r} is truncated: {name} has {size} bytes, the manifest "
                                  f"records {want_bytes}")
        if _crc32(fp) != want_crc:
            raise CheckpointError(f"checkpoint {path!r} is corrupt: {name} fails its CRC-32 check")


def resolve(resume: str, out: str, warn: bool = True, what: str = "--resume") -> str:
    """The checkpoint folder `--resume` means.  "latest": the newest whole checkpoint under
    `<out>/checkpoints`; a folder of `step-N` checkpoints (or a run's --out folder): its newest whole
    one; otherwise the folder must be a checkpoint itself.  Newer checkpoints that fail their checks
    are skipped with a warning.  `what` names the folder's argument in a refusal (`par3d export` has no
    --resume).  Raises CheckpointError."""
    base = checkpoints_root(out) if resume == "latest" else resume
    if not os.path.isdir(base):
        if resume == "latest":
            raise CheckpointError(f"--resume: no checkpoints to resume from: {base!r} does not exist "
                                  f"(save some with --save-every N, or give --resume DIR)")
        raise CheckpointError(f"{what} {resume!r}: no such folder")
    if not list_checkpoints(base) and os.path.isdir(checkpoints_root(base)):
        base = checkpoints_root(base)
    found = list_checkpoints(base)
    if not found:
        if resume == "latest":
            raise CheckpointError(f"--resume: no checkpoints in {base!r}")
        read_manifest(base)  # a checkpoint folder itself; raises its own precise error
        return base
    skipped: list[str] = []
    for _step, path in reversed(found):
        try:
            read_manifest(path)
        except CheckpointError as e:
            skipped.append(str(e))
            continue
        if warn:
            for s in skipped:
                print(f"par3d: skipping a damaged checkpoint: {s}", file=sys.stderr)
        return path
    raise CheckpointError(f"--resume: no loadable checkpoint in {base!r}: " + "; ".join(skipped))


def _model_value(model: dict[str, Any], name: str) -> Any:
    from par3d.config import ModelConfig

    # compare resolved values: ffn_hidden None means 4 x hidden, kv_heads None means heads, the
    # architecture's switches None mean its defaults (checkpoints older than them are GPTs)
    known = {k: v for k, v in model.items() if k in ModelConfig.__dataclass_fields__}
    try:
        mc = ModelConfig(**known).fill_arch()
    except TypeError:
        return model.get(name)
    return {"ffn_hidden": mc.ffn, "kv_heads": mc.kv, "max_positions": mc.positions}.get(name, getattr(mc, name))


def _flag_hint(name: str, value: Any) -> str:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return f"{'give' if value else 'drop'} {flag}"
    return f"give {flag} {value}"


def check_compatible(man: dict[str, Any], cfg: RunConfig, path: str) -> list[str]:
    """Raise CheckpointError when the checkpoint holds another model than `cfg`; return notes on
    training settings that differ (allowed, but the run will not replay the original one)."""
    have = man["config"].get("model", {}) if isinstance(man["config"], dict) else {}
    want = dataclasses.asdict(cfg.model)
    problems = []
    for name in _MODEL_FIELDS:
        a, b = _model_value(have, name), _model_value(want, name)
        if a != b:
            problems.append(f"checkpoint {path!r} has model.{name}={a!r}, this run has model.{name}={b!r}; "
                            f"{_flag_hint(name, a)} to resume it, or start a new run without --resume")
    if problems:
        raise CheckpointError(problems)
    notes = []
    old_train = man["config"].get("train", {})
    new_train = dataclasses.asdict(cfg.train)
    for name in _TRAIN_FIELDS:
        if name in old_train and old_train[name] != new_train[name]:
            notes.append(f"resuming with train.{name}={new_train[name]!r} (the checkpoint was written with "
                         f"{old_train[name]!r})")
    if man["step"] >= cfg.train.steps:
        notes.append(f"the checkpoint is at step {man['step']} and --steps is {cfg.train.steps}: "
                     f"nothing left to train")
    return notes


# ---- which tensor is where (torch) ------------------------------------------------------------------

@dataclass
class _Entry:
    """One parameter this rank holds: its global name, model chunk and offset in the flat buffers."""

    name: str
    chunk: int
    param: Any
    offset: int
    copy: bool  # the last stage's copy of a tied embedding: saved once, from the first stage


def _entries(chunks: list[Any], dpar: Any, tied: bool) -> list[_Entry]:
    from par3d.model import global_named_parameters

    out = []
    for ci, (chunk, buf) in enumerate(zip(chunks, dpar.bufs)):
        offset = buf.offsets  # where each parameter sits in the chunk's flat buffers
        for name, p in global_named_parameters(chunk):
            copy = name == "head.weight" and tied
            out.append(_Entry("embedding.tok.weight" if copy else name, ci, p, offset[id(p)], copy))
    return out


def _full_shape(e: _Entry, tp_size: int, vocab: int) -> list[int]:
    shape = list(e.param.shape)
    if getattr(e.param, "tp_sharded", False):
        shape[e.param.shard_dim] *= tp_size
    if e.name in _VOCAB_PARAMS:
        shape[0] = vocab
    return shape


def _gather_full(flat: Any, e: _Entry, groups: Any, vocab: int) -> Any:
    """The full tensor of entry `e` from this TP group's slices of `flat` (collective over TP)."""
    from par3d.model import full_tensor

    local = flat[e.offset:e.offset + e.param.numel()].view(e.param.shape)
    return full_tensor(e.name, local, e.param, groups.tp, vocab)


def _cut_local(full: Any, e: _Entry, groups: Any, vocab: int) -> Any:
    """This rank's slice of a full tensor, cut exactly as initialisation cuts it."""
    import torch

    from par3d.tensor_parallel import padded_vocab, shard_cols, shard_rows

    p = e.param
    if e.name in _VOCAB_PARAMS:
        padded = torch.zeros((padded_vocab(vocab, groups.tp.size),) + tuple(full.shape[1:]), dtype=full.dtype)
        padded[:vocab] = full
        full = padded
    if getattr(p, "tp_sharded", False) and groups.tp.size > 1:
        full = shard_rows(full, groups.tp, p.shard_stride) if p.shard_dim == 0 else shard_cols(full, groups.tp)
    return full


_KINDS = ("model", "exp_avg", "exp_avg_sq")


def _rng_key(coord: Any, cuda: bool = False) -> str:
    cp = f".{coord.cp}" if getattr(coord, "cp", 0) else ""  # CP rank 0 keeps the key of before CP
    return f"{'rng_cuda' if cuda else 'rng'}/{coord.dp}.{coord.pp}.{coord.tp}{cp}"


def _layout(cfg: RunConfig) -> dict[str, Any]:
    p = cfg.parallel
    return {"dp": p.dp, "pp": p.pp, "tp": p.tp, "cp": p.cp, "virtual_stages": p.virtual_stages,
            "zero_stage": p.zero_stage,
            "schedule": p.schedule, "microbatches": p.microbatches, "world_size": p.world_size}


def _same_rng_layout(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("dp", "pp", "tp", "virtual_stages")) and \
        a.get("cp", 1) == b.get("cp", 1)


# ---- save -------------------------------------------------------------------------------------------

def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _discard(path: str) -> None:
    """Remove a folder by first renaming it out of the `step-N` namespace, so that a crash halfway
    through the removal never leaves something that looks like a checkpoint."""
    parent, name = os.path.split(path)
    trash = os.path.join(parent, f".trash-{name}-{os.getpid()}-{time.monotonic_ns()}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def prune(root: str, keep_last: int) -> list[str]:
    """Keep the newest `keep_last` checkpoints; remove older ones and leftovers of crashed saves."""
    removed = []
    for _step, path in list_checkpoints(root)[:-keep_last]:
        _discard(path)
        removed.append(path)
    for name in os.listdir(root):
        if name.startswith(".trash-"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return removed


def _publish(tmp: str, final: str) -> None:
    if os.path.exists(final):  # the same step saved again (a resumed run with another --save-every)
        _discard(final)
    os.rename(tmp, final)
    _fsync_dir(os.path.dirname(final))


def _write_manifest(tmp: str, man: dict[str, Any]) -> None:
    files = {}
    for name in sorted(os.listdir(tmp)):
        fp = os.path.join(tmp, name)
        if os.path.isfile(fp):
            files[name] = {"bytes": os.path.getsize(fp), "crc32": _crc32(fp)}
    man["files"] = files
    part = os.path.join(tmp, MANIFEST + ".part")
    with open(part, "w", encoding="utf-8") as fh:
        json.dump(man, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(part, os.path.join(tmp, MANIFEST))
    _fsync_dir(tmp)


def save(root: str, step: int, chunks: list[Any], dpar: Any, groups: Any, cfg: RunConfig,
         hook: Callable[[str], None] | None = None) -> str | None:
    """Collective over the layout's ranks: write the checkpoint of `step` steps done into
    `root/step-N` and keep the newest `cfg.keep_last`.  Returns the folder, or None when a weight or
    optimizer value is not finite (nothing is written then).  `hook("save")` runs mid-save on every
    rank (tests use it to kill a rank there)."""
    import warnings

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    import par3d
    from par3d import comm

    mc, c = cfg.model, groups.coord
    is_rank0 = groups.global_rank == 0
    device = next(chunks[0].parameters()).device
    final = os.path.join(root, step_dir_name(step))
    tmp = os.path.join(root, ".tmp-" + step_dir_name(step))
    comm.COUNTER.enabled = False  # a save is not part of any step's communication
    try:
        bad = torch.tensor([0.0 if dpar.finite() else 1.0], device=device)
        comm.all_reduce(bad, groups.world, op=dist.ReduceOp.MAX)  # every rank decides alike
        if float(bad) > 0:
            if is_rank0:
                print(f"par3d: not saving the checkpoint of step {step}: the weights or optimizer state "
                      f"hold NaN/Inf", file=sys.stderr, flush=True)
            return None
        if is_rank0:
            os.makedirs(root, exist_ok=True)
            if os.path.exists(tmp):  # left by a save that crashed
                shutil.rmtree(tmp)
            os.makedirs(tmp)
        comm.all_reduce(torch.zeros(1, device=device), groups.world)  # the folder exists for everyone
        if hook is not None:
            hook("save")

        state: dict[str, Any] = {_rng_key(c): torch.get_rng_state()}
        if torch.cuda.is_available():
            state[_rng_key(c, cuda=True)] = torch.cuda.get_rng_state()
        # every rank's state over its whole flat layout: ZeRO's owned slices gathered over dp x cp
        flats = {kind: [dpar.full_flat(kind, ci) for ci in range(len(chunks))] for kind in _KINDS}
        if c.dp == 0 and c.cp == 0:  # one replica holds everything; its TP ranks gather, TP rank 0 writes
            for e in _entries(chunks, dpar, mc.tied_embeddings):
                if e.copy:
                    continue
                for kind in _KINDS:
                    full = _gather_full(flats[kind][e.chunk], e, groups, mc.vocab)
                    if c.tp == 0:
                        state[f"{kind}/{e.name}"] = full
        with warnings.catch_warnings():  # DCP warns that a one-rank layout saves "in a single process"
            warnings.simplefilter("ignore")
            meta = dcp.save(state, storage_writer=FileSystemWriter(tmp), process_group=groups.world.pg,
                            no_dist=groups.world.pg is None)
        if is_rank0:
            man = {
                "format": FORMAT, "format_version": FORMAT_VERSION, "par3d_version": par3d.__version__,
                "torch_version": torch.__version__, "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "step": step, "optimizer_steps": dpar.step_count, "layout": _layout(cfg),
                "config": cfg.to_dict(),
                "tensors": {k: list(v.size) for k, v in sorted(meta.state_dict_metadata.items())
                            if hasattr(v, "size")},
            }
            _write_manifest(tmp, man)
            _publish(tmp, final)
            prune(root, cfg.keep_last)
        comm.all_reduce(torch.zeros(1, device=device), groups.world)  # in place when anyone returns
    finally:
        comm.COUNTER.enabled = True
    return final


# ---- load -------------------------------------------------------------------------------------------

def load(path: str, chunks: list[Any], dpar: Any, groups: Any, cfg: RunConfig) -> dict[str, Any]:
    """Fill this rank's parameters, fp32 master weights, Adam state, optimizer step count and RNG
    from checkpoint `path`, whatever layout wrote it.  No communication: each rank reads the full
    tensors it needs.  Returns the manifest (its "step" is the step to resume at)."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    man = read_manifest(path)
    check_compatible(man, cfg, path)
    mc, c = cfg.model, groups.coord
    entries = _entries(chunks, dpar, mc.tied_embeddings)
    state: dict[str, Any] = {}
    for e in entries:
        shape = _full_shape(e, groups.tp.size, mc.vocab)
        for kind in ("model", "exp_avg", "exp_avg_sq"):
            key = f"{kind}/{e.name}"
            have = man["tensors"].get(key)
            if have is None:
                raise CheckpointError(f"checkpoint {path!r} has no tensor {key}")
            if list(have) != shape:
                raise CheckpointError(f"checkpoint {path!r}: {key} has shape {have}, this model has {shape}")
            state[key] = torch.empty(shape, dtype=torch.float32)
    same_layout = _same_rng_layout(man["layout"], _layout(cfg))
    rng_keys = [_rng_key(c)] + ([_rng_key(c, cuda=True)] if torch.cuda.is_available() else [])
    rng_keys = [k for k in rng_keys if same_layout and k in man["tensors"]]
    for k in rng_keys:
        state[k] = torch.empty(man["tensors"][k], dtype=torch.uint8)
    try:
        with warnings.catch_warnings():  # "loading in a single process" is exactly what we mean
            warnings.simplefilter("ignore")
            dcp.load(state, storage_reader=FileSystemReader(path), no_dist=True)
    except Exception as e:  # DCP's errors are long; the first line says what failed
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path!r}: reading its tensors failed: {first}") from e

    device = next(chunks[0].parameters()).device
    with torch.no_grad():
        # this rank's TP slices over the chunk's whole flat layout; the DP object keeps what it owns
        for kind in _KINDS:
            for ci in range(len(chunks)):
                flat = torch.zeros(dpar.flat_numel(ci), dtype=torch.float32, device=device)
                for e in (e for e in entries if e.chunk == ci):
                    local = _cut_local(state[f"{kind}/{e.name}"], e, groups, mc.vocab)
                    flat[e.offset:e.offset + e.param.numel()].copy_(local.reshape(-1))
                dpar.load_flat(kind, ci, flat)
    dpar.step_count = int(man["optimizer_steps"])
    if rng_keys:
        torch.set_rng_state(state[_rng_key(c)])
        if torch.cuda.is_available() and _rng_key(c, cuda=True) in state:
            torch.cuda.set_rng_state(state[_rng_key(c, cuda=True)])
    else:
        # another layout: no rank's stream exists there.  Re-seed from (seed, coordinates, step) so
        # the run is still reproducible; only dropout draws from it (0 by default).
        torch.manual_seed(cfg.train.seed + 1000 * c.dp + c.pp + 1_000_003 * int(man["step"]))
    return man


def load_weights(path: str, chunks: list[Any], groups: Any, cfg: RunConfig) -> dict[str, Any]:
    """Only the model's weights from checkpoint `path` into this rank's parameters (any layout
    wrote it), for evaluation: no optimizer state, no RNG.  Each rank reads the full tensors it
    holds a slice of and cuts them as `load` does.  Returns the manifest."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    from par3d.model import global_named_parameters

    man = read_manifest(path)
    check_compatible(man, cfg, path)
    mc = cfg.model
    todo: list[tuple[str, Any]] = []
    state: dict[str, Any] = {}
    for chunk in chunks:
        for name, p in global_named_parameters(chunk):
            key = "embedding.tok.weight" if (name == "head.weight" and mc.tied_embeddings) else name
            e = _Entry(key, 0, p, 0, False)
            shape = _full_shape(e, groups.tp.size, mc.vocab)
            if list(man["tensors"].get(f"model/{key}", [])) != shape:
                raise CheckpointError(f"checkpoint {path!r}: model/{key} is missing or not of shape {shape}")
            state[f"model/{key}"] = torch.empty(shape, dtype=torch.float32)
            todo.append((key, p))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=FileSystemReader(path), no_dist=True)
    with torch.no_grad():
        for key, p in todo:
            p.copy_(_cut_local(state[f"model/{key}"], _Entry(key, 0, p, 0, False), groups, mc.vocab).to(p.dtype))
    return man
