"""`par3d train`: the main job.  Every config field has a flag; `--config FILE` (TOML) sets
defaults that flags override.  Validation happens here, before any process starts."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def chunk_times(text: str) -> list[float]:
    """--zbv-times' value: F,BI,BW, three times > 0 (any unit: only their ratios order the schedule), optionally
    the share in (0, 1] of a chunk's activations BI keeps for BW, and then the head chunk's (> 0)."""
    try:
        times = [float(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not three comma-separated times, e.g. 1,2,1") from None
    if (len(times) not in (3, 4, 5) or any(not 0 < t < float("inf") for t in times)
            or (len(times) >= 4 and times[3] > 1)):
        raise argparse.ArgumentTypeError(f"{text!r}: give three times > 0, F,BI,BW of one chunk, optionally the "
                                         "share in (0, 1] of its activations BI keeps for BW, and then what the "
                                         "head's chunk keeps (> 0, in chunks' forwards), e.g. 1,2,1 or "
                                         "1,1.1,0.9,0.43 or 1,1.1,0.9,0.43,1.6")
    return times


def layer_counts(text: str) -> list[int]:
    """--pipeline-layout's value (par3d train and par3d plan): comma-separated layer counts >= 0."""
    try:
        counts = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of layer counts, e.g. 3,5") from None
    if any(n < 0 for n in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: layer counts must be >= 0")
    return counts


# (flag, section, field, type, help)
FIELDS: list[tuple[str, str, str, Any, str]] = [
    ("--dp", "parallel", "dp", int, "data-parallel degree (replicas). Default: 2 when none of --dp/--pp/--tp "
                                    "is given (the 2x2x2 demo), else 1"),
    ("--pp", "parallel", "pp", int, "pipeline-parallel degree (stages). Default as for --dp"),
    ("--tp", "parallel", "tp", int, "tensor-parallel degree; must divide --heads. Default as for --dp"),
    ("--schedule", "parallel", "schedule", str, "pipeline schedule: gpipe | 1f1b | interleaved | zb-h1 | zb-v | "
                                                "dualpipe-v (default 1f1b; zb-v and dualpipe-v hold stages r and "
                                                "2p-1-r on rank r)"),
    ("--schedule-csv", "parallel", "schedule_csv", str, "run this schedule instead of --schedule: a compute-only "
                                                        "CSV in torch.distributed.pipelining's notation (one row "
                                                        "per rank, cells like 0F1, 1I0, 1W0, 2B3; empty cells are "
                                                        "bubbles), e.g. from par3d simulate --to-csv; sets "
                                                        "--microbatches and --virtual-stages"),
    ("--microbatches", "parallel", "microbatches", int, "micro-batches per step per DP rank (m); derived "
                                                       "from the global batch when omitted"),
    ("--virtual-stages", "parallel", "virtual_stages", int, "model chunks per pipeline rank (v) for the "
                                                           "interleaved schedule (default 1; 2 for zb-v and "
                                                           "dualpipe-v)"),
    ("--zbv-times", "parallel", "zbv_times", chunk_times,
     "zb-v only: F,BI,BW of one chunk, the times zb-v's list scheduler orders the actions for (only their ratios "
     "count; default equal times), optionally a fourth number, the share in (0, 1] of a chunk's activations "
     "its BI keeps for its BW, which the 2p-chunk memory cap counts (default 1: whole until BW), and a fifth, what "
     "the head's chunk keeps, with the output layer's input and logits' gradient, in chunks' forwards (may pass 1; "
     "default the fourth); par3d plan names the ones its plan was priced with and --emit-config writes them"),
    ("--pipeline-layout", "parallel", "pipeline_layout", layer_counts,
     "layers of each pipeline chunk in model order, pp x virtual-stages comma-separated counts (the first chunk "
     "also holds the embedding, the last the head; those two may be 0), as Megatron-Core's "
     "--pipeline-model-parallel-layout cuts a model, e.g. 3,5 for 8 layers on pp 2 (default: the balanced "
     "partition; par3d plan's JSON names each plan's chunk_layers)"),
    ("--cp", "parallel", "cp", int, "context-parallel degree: the sequence split over cp ranks (each holds two "
                                    "mirrored chunks; ring attention); --seq-len must be a multiple of 2 x cp"),
    ("--zero-stage", "parallel", "zero_stage", int, "ZeRO stage over the DP (x CP) group: 0 plain DP; 1 optimizer "
                                                    "state sharded; 2 + gradients (reduce-scattered per bucket "
                                                    "in backward); 3 + parameters (gathered per layer)"),
    ("--recompute", "parallel", "recompute", str, "activation recomputation: none | selective (attention "
                                                  "core) | full (whole block)"),
    ("--p2p", "parallel", "p2p", str, "pipeline transfers: auto (shared memory between CPU ranks on one "
                                      "host, else the backend) | shm | backend (gloo/nccl send/recv)"),
    ("--layers", "model", "layers", int, "transformer blocks"),
    ("--hidden", "model", "hidden", int, "hidden size h"),
    ("--heads", "model", "heads", int, "attention heads (must divide --hidden)"),
    ("--ffn-hidden", "model", "ffn_hidden", int, "MLP inner size (default 4 x hidden)"),
    ("--seq-len", "model", "seq_len", int, "tokens per sequence"),
    ("--vocab", "model", "vocab", int, "vocabulary size (byte tokenizer: 256; larger pads, smaller "
                                       "is invalid for byte data)"),
    ("--arch", "model", "arch", str, "architecture: gpt (LayerNorm, learned positions, GeLU, biases) | llama "
                                     "(RMSNorm, rotary positions, SwiGLU, no biases); the switches below "
                                     "override single parts"),
    ("--kv-heads", "model", "kv_heads", int, "K/V heads for grouped-query attention (must divide --heads; "
                                             "default: --heads)"),
    ("--norm", "model", "norm", str, "layernorm | rmsnorm (par3d plan's layer | rms alike; default: the arch's)"),
    ("--norm-eps", "model", "norm_eps", float, "epsilon of the norms (default: gpt 1e-5, llama 1e-6)"),
    ("--position", "model", "position", str, "learned | rope (par3d plan's rotary alike; default: the arch's)"),
    ("--rope-theta", "model", "rope_theta", float, "base of the rotary frequencies (default 10000)"),
    ("--max-positions", "model", "max_positions", int, "rows of a learned position table (default --seq-len)"),
    ("--activation", "model", "activation", str, "MLP activation: gelu (exact) | gelu_tanh (GPT-2's gelu_new) "
                                                 "| silu (default: the arch's)"),
    ("--dropout", "model", "dropout", float, "dropout probability (default 0; >0 is not layout-invariant)"),
    ("--global-batch", "train", "global_batch", int, "sequences per optimizer step over all DP ranks"),
    ("--micro-batch", "train", "micro_batch", int, "sequences per micro-batch per DP rank; derived when omitted"),
    ("--steps", "train", "steps", int, "optimizer steps"),
    ("--lr", "train", "lr", float, "peak learning rate (AdamW)"),
    ("--min-lr", "train", "min_lr", float, "final learning rate of the cosine decay"),
    ("--warmup", "train", "warmup", int, "linear warm-up steps"),
    ("--weight-decay", "train", "weight_decay", float, "AdamW decoupled weight decay (2-D weights only)"),
    ("--grad-clip", "train", "grad_clip", float, "clip the global gradient norm to this (0: off)"),
    ("--seed", "train", "seed", int, "seed of initialisation and data sampling"),
    ("--dtype", "train", "dtype", str, "fp32 | bf16 (bf16 weights/activations, fp32 master weights, grads "
                                       "reduced and optimizer state in fp32)"),
    ("--data", "train", "data", str, "text file or folder to train on (default: the Python standard "
                                     "library's source)"),
    ("--tokenizer", "train", "tokenizer", str, "a Hugging Face tokenizer.json (needs par3d[hf]); default: "
                                               "bytes, no download"),
    ("--out", "train", "out", str, "output directory (checkpoints, traces, reports)"),
    ("--on-nonfinite", "train", "on_nonfinite", str, "skip | stop: what a NaN/Inf loss or gradient does"),
]


def register(sub: Any) -> None:
    ap = sub.add_parser("train", help="train a GPT on dp x pp x cp x tp processes",
                        description="Train a GPT with data, pipeline and tensor parallelism. Starts "
                                    "dp*pp*cp*tp local processes on gloo (CPU) / nccl (GPU), or joins a "
                                    "torchrun world when launched by torchrun.")
    ap.add_argument("--config", help="TOML file with [model], [parallel], [train] tables; flags override it")
    for flag, _sec, _field, typ, hlp in FIELDS:
        ap.add_argument(flag, type=typ, default=None, help=hlp)
    ap.add_argument("--sequence-parallel", action="store_true", default=None,
                    help="shard LayerNorm/dropout regions along the sequence (needs tp>1 to matter)")
    ap.add_argument("--tied-embeddings", action="store_true", default=None,
                    help="share the token embedding with the LM head")
    add_model_source_flags(ap)
    ap.add_argument("--nproc", type=int, default=None, help="local processes to start (default dp*pp*cp*tp)")
    ap.add_argument("--metrics-out", default=None,
                    help="write one JSON line per step (step, loss, lr, tokens, step_time_s) from rank 0")
    ap.add_argument("--trace-out", default=None,
                    help="folder for a Chrome/Perfetto trace, a Gantt PNG (measured vs simulated) and "
                         "the report (default: OUT/trace)")
    ap.add_argument("--comm-report", action="store_true", default=None,
                    help="print the last step's elements per call for each group and kind, with the seed's "
                         "per-layer TP accounting; every step's calls, bytes and sizes go to --metrics-out")
    ap.add_argument("--synthetic-stage-ms", default=None,
                    help="F,B: stages wait F and B milliseconds instead of computing (measures the "
                         "runtime's own overhead)")
    ap.add_argument("--timeout", dest="timeout_s", type=float, default=None,
                    help="seconds after which a stuck collective or a dead peer ends the run (default 60)")
    ap.add_argument("--threads", dest="threads_per_rank", type=int, default=None,
                    help="CPU threads per rank (default 1)")
    ap.add_argument("--save-every", type=int, default=None, help="checkpoint every N steps (0: never)")
    ap.add_argument("--keep-last", type=int, default=None, help="checkpoints to keep (default 2)")
    ap.add_argument("--resume", nargs="?", const="latest", default=None,
                    help="resume from a checkpoint folder (or the latest in --out)")
    ap.add_argument("--hardware", default=None, help="calibrated hardware file for the predicted step time")
    ap.add_argument("--no-progress", dest="progress", action="store_false", default=None,
                    help="no progress bar")
    ap.add_argument("--json", action="store_true", default=None, help="print the end-of-run report as JSON")
    ap.add_argument("--dry-run", action="store_true", default=False,
                    help="run every check made before the processes start (configuration, data, outputs, "
                         "the memory estimate), print the resolved layout and exit without training")
    ap.set_defaults(func=run)


def add_model_source_flags(ap: Any) -> None:
    ap.add_argument("--gated-mlp", action=argparse.BooleanOptionalAction, default=None,
                    help="gated (SwiGLU-style) MLP: act(x W_gate) * (x W_up) (default: the arch's)")
    ap.add_argument("--bias", action=argparse.BooleanOptionalAction, default=None,
                    help="biases in the linear layers (default: gpt yes, llama no)")
    ap.add_argument("--model", default=None, metavar="NAME|PATH",
                    help="the model's shapes and architecture from a catalogue name (par3d plan --list-models) "
                         "or a Hugging Face config.json / model folder; model flags override it")
    ap.add_argument("--init-from", default=None, metavar="PATH",
                    help="start from a Hugging Face checkpoint folder (LlamaForCausalLM or GPT2LMHeadModel "
                         "saved with save_pretrained; safetensors, single or sharded): the model is its "
                         "config.json's, and each rank reads only its slices (needs par3d[hf])")


def apply_model_source(cfg: Any, args: argparse.Namespace) -> None:
    """--model / --init-from set the whole [model] section (before the single model flags)."""
    from par3d.config import ConfigError, model_config_from_hf_folder, model_config_from_name

    if args.model and args.init_from:
        raise ConfigError(["--model and --init-from both describe the model; give one (--init-from reads "
                           "its folder's config.json)"])
    seq = args.seq_len or (cfg.model.seq_len if args.config else None)
    if args.init_from:
        cfg.model = model_config_from_hf_folder(args.init_from, seq)
    elif args.model:
        cfg.model = model_config_from_name(args.model, seq)
    if args.init_from:
        cfg.init_from = args.init_from
    if args.gated_mlp is not None:
        cfg.model.gated_mlp = args.gated_mlp
    if args.bias is not None:
        cfg.model.bias = args.bias


def config_from_args(args: argparse.Namespace) -> Any:
    from par3d.config import ConfigError, RunConfig

    cfg = RunConfig.load_toml(args.config) if args.config else RunConfig()
    apply_model_source(cfg, args)
    layout_given = any(getattr(args, k) is not None for k in ("dp", "pp", "tp"))
    if not args.config and not layout_given:
        # the demo: all three dimensions on 8 local processes
        cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp = 2, 2, 2
    for flag, sec, field, _typ, _h in FIELDS:
        val = getattr(args, flag.lstrip("-").replace("-", "_"))
        if val is not None:
            setattr(getattr(cfg, sec), field, val)
    if args.sequence_parallel:
        cfg.parallel.sequence_parallel = True
    if args.tied_embeddings:
        cfg.model.tied_embeddings = True
    for name in ("nproc", "metrics_out", "trace_out", "comm_report", "timeout_s", "threads_per_rank",
                 "save_every", "keep_last", "resume", "hardware", "progress", "json"):
        val = getattr(args, name)
        if val is not None:
            setattr(cfg, name, val)
    if args.synthetic_stage_ms is not None:
        try:
            f, b = (float(x) for x in str(args.synthetic_stage_ms).split(","))
        except ValueError:
            raise ConfigError([f"synthetic_stage_ms={args.synthetic_stage_ms!r} must be two numbers F,B "
                               f"in milliseconds, e.g. --synthetic-stage-ms 2,2"]) from None
        cfg.synthetic_stage_ms = (f, b)
    return cfg


def run(args: argparse.Namespace) -> int:
    from par3d.config import ConfigError

    try:
        cfg = config_from_args(args)
        cfg.validate()
        if cfg.trace_out is None:  # every run ends with its trace and report, next to its outputs
            cfg.trace_out = os.path.join(cfg.train.out, "trace")
    except ConfigError as e:
        print(f"par3d train: {e}", file=sys.stderr)
        return 2
    if cfg.hardware:  # read before any rank starts: a bad file is an error now, another host's a warning
        from par3d.host import warn_if_other_host
        from par3d.plan.hardware import HardwareError, load_hardware_file
        from par3d.plan.profile import checked_profile

        try:
            hw = load_hardware_file(cfg.hardware)
            warn_if_other_host(cfg.hardware, hw.extra, "par3d train")
            # its host profile too, which the end-of-run prediction reads: a damaged one is refused now, not after
            # the run (as predict.py reads it)
            checked_profile(hw)
        except HardwareError as e:
            msg = str(e)
            print(f"par3d train: {msg if msg.startswith('--') else f'--hardware {cfg.hardware}: {msg}'}", file=sys.stderr)
            return 2
    if args.dry_run:
        return _dry_run(cfg)
    from par3d.distributed import RankFailure
    from par3d.report import finish_run

    try:
        from par3d.train import run as train_run

        results = train_run(cfg)
    except ConfigError as e:  # data, checkpoint or launcher problems found by preflight
        print(f"par3d train: {e}", file=sys.stderr)
        return 2
    except RankFailure as e:
        print(f"par3d train: {e}", file=sys.stderr)
        return 1
    report = finish_run(cfg, results)
    if report is not None:
        if cfg.json:
            print(json.dumps(report, indent=2))
    return 0


def _dry_run(cfg: Any) -> int:
    """--dry-run: the parent's checks (train.preflight), then one line on what would start."""
    from par3d.config import ConfigError
    from par3d.train import preflight

    try:
        preflight(cfg)
    except ConfigError as e:
        print(f"par3d train: {e}", file=sys.stderr)
        return 2
    pc, tc = cfg.parallel, cfg.train
    v = f" v={pc.virtual_stages}" if pc.virtual_stages > 1 else ""
    print(f"par3d train: configuration ok: {pc.world_size} processes (dp={pc.dp} pp={pc.pp} tp={pc.tp}), "
          f"{'schedule from ' + pc.schedule_csv if pc.schedule_csv else pc.schedule}{v}, m={pc.microbatches}, "
          f"micro-batch {tc.micro_batch}, {tc.steps} steps; not started (--dry-run)")
    return 0
