"""`par3d eval`: the mean token cross-entropy of a Hugging Face checkpoint (--init-from) or a par3d
checkpoint (--resume) on the first batches of a text, under any layout; --json prints
{"loss": ..., "tokens": ...}."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: Any) -> None:
    ap = sub.add_parser("eval", help="mean token cross-entropy of a checkpoint on a text, under any layout",
                        description="Evaluate a model: the mean cross-entropy per token over the first "
                                    "--eval-batches batches of --data, cut into consecutive windows of "
                                    "--seq-len tokens. The same tokens are scored whatever the layout.")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--init-from", metavar="PATH", help="a Hugging Face model folder (save_pretrained; "
                                                          "LlamaForCausalLM or GPT2LMHeadModel; needs par3d[hf])")
    src.add_argument("--resume", metavar="DIR", help="a par3d checkpoint folder (or a run's --out / its "
                                                      "checkpoints folder: the newest whole checkpoint)")
    ap.add_argument("--data", required=True, help="text file or folder of text files to score")
    ap.add_argument("--tokenizer", default=None, help="a Hugging Face tokenizer.json (default: bytes)")
    ap.add_argument("--eval-batches", type=int, default=4, help="batches to score (default 4)")
    ap.add_argument("--global-batch", type=int, default=None,
                    help="sequences per batch over all DP ranks (default 8)")
    ap.add_argument("--seq-len", type=int, default=None,
                    help="tokens per sequence (default: the checkpoint's; for --init-from 64)")
    for flag, hlp in (("--dp", "data-parallel degree"), ("--pp", "pipeline-parallel degree"),
                      ("--tp", "tensor-parallel degree"),
                      ("--virtual-stages", "model chunks per pipeline rank (default 1)")):
        ap.add_argument(flag, type=int, default=None, help=f"{hlp} (default 1)" if "default" not in hlp else hlp)
    ap.add_argument("--sequence-parallel", action="store_true", default=False,
                    help="shard the norms' activations along the sequence (tp > 1)")
    ap.add_argument("--dtype", default=None, help="fp32 | bf16 (default fp32)")
    ap.add_argument("--timeout", dest="timeout_s", type=float, default=60.0,
                    help="seconds after which a stuck collective ends the run (default 60)")
    ap.add_argument("--threads", dest="threads_per_rank", type=int, default=1, help="CPU threads per rank")
    ap.add_argument("--json", action="store_true", help='print {"loss": ..., "tokens": ...} as JSON')
    ap.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> tuple[Any, str | None]:
    """The run's config and the checkpoint folder (--resume); raises ConfigError."""
    from par3d import checkpoint
    from par3d.config import ConfigError, ModelConfig, RunConfig, model_config_from_hf_folder

    resume_dir = None
    cfg = RunConfig()
    if args.init_from:
        cfg.model = model_config_from_hf_folder(args.init_from, args.seq_len or 64)
        cfg.init_from = args.init_from
    else:
        resume_dir = checkpoint.resolve(args.resume, args.resume)
        saved = checkpoint.read_manifest(resume_dir)["config"]["model"]
        cfg.model = ModelConfig(**{k: v for k, v in saved.items() if k in ModelConfig.__dataclass_fields__})
        if args.seq_len is not None and args.seq_len != cfg.model.seq_len:
            raise ConfigError([f"--seq-len {args.seq_len}: the checkpoint's model has seq_len="
                               f"{cfg.model.seq_len}; drop --seq-len"])
    cfg.model.dropout = 0.0
    p, t = cfg.parallel, cfg.train
    p.dp, p.pp, p.tp = args.dp or 1, args.pp or 1, args.tp or 1
    p.virtual_stages = args.virtual_stages or 1
    p.schedule = "interleaved" if p.virtual_stages > 1 else "1f1b"
    p.sequence_parallel = bool(args.sequence_parallel)
    t.global_batch = args.global_batch or 8
    # evaluation walks the stages itself; m only has to satisfy the schedule's rules (interleaved: m = pp)
    p.microbatches, t.micro_batch = (p.pp if p.schedule == "interleaved" else 1), None
    t.data, t.tokenizer, t.dtype = args.data, args.tokenizer, args.dtype or "fp32"
    cfg.timeout_s, cfg.threads_per_rank = args.timeout_s, args.threads_per_rank
    cfg.validate()
    if not (isinstance(args.eval_batches, int) and args.eval_batches >= 1):
        raise ConfigError([f"--eval-batches {args.eval_batches}: must be an integer >= 1"])
    return cfg, resume_dir


def preflight(cfg: Any, eval_batches: int) -> None:
    """The data holds enough tokens and fits the vocabulary; the Hugging Face folder matches."""
    from par3d.config import ConfigError
    from par3d.data import Corpus, eval_tokens_needed
    from par3d.train import check_init_from

    errs = check_init_from(cfg) if cfg.init_from else []
    try:
        corpus = Corpus.load(cfg.train.data, cfg.train.tokenizer)
    except (OSError, ValueError) as e:
        raise ConfigError([f"--data {cfg.train.data!r}: {e}"]) from None
    need = eval_tokens_needed(eval_batches, cfg.train.global_batch, cfg.model.seq_len)
    if len(corpus) < need:
        errs.append(f"--data {cfg.train.data!r} holds {len(corpus)} tokens; {eval_batches} batches of "
                    f"{cfg.train.global_batch} x {cfg.model.seq_len} need {need}: use fewer --eval-batches, "
                    f"a smaller --global-batch or more text")
    top = corpus.vocab if cfg.train.tokenizer else (int(corpus.tokens.max()) + 1 if len(corpus) else 0)
    if top > cfg.model.vocab:
        errs.append(f"the data's tokens reach {top - 1} but the model's vocabulary is {cfg.model.vocab}; "
                    f"give a --tokenizer whose vocabulary fits the model")
    if errs:
        raise ConfigError(errs)


def run(args: argparse.Namespace) -> int:
    from par3d.config import ConfigError
    from par3d.distributed import RankFailure

    try:
        cfg, resume_dir = config_from_args(args)
        preflight(cfg, args.eval_batches)
    except ConfigError as e:
        print(f"par3d eval: {e}", file=sys.stderr)
        return 2
    from par3d.evaluate import run_eval

    try:
        out = run_eval(cfg, args.eval_batches, resume_dir)
    except RankFailure as e:
        print(f"par3d eval: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out))
    else:
        print(f"loss {out['loss']:.6f} over {out['tokens']} tokens "
              f"(dp={cfg.parallel.dp} pp={cfg.parallel.pp} tp={cfg.parallel.tp})")
    return 0
