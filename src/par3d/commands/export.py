"""`par3d export CHECKPOINT_DIR --hf OUT_DIR`: a par3d checkpoint (saved under any layout) as a
Hugging Face model folder (config.json + model.safetensors) that
`transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)` loads."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(sub: Any) -> None:
    ap = sub.add_parser("export", help="write a par3d checkpoint as a Hugging Face model folder",
                        description="Convert a par3d checkpoint into config.json + model.safetensors: "
                                    "LlamaForCausalLM for llama models, GPT2LMHeadModel for GPTs. One "
                                    "process; the checkpoint may come from any layout. Needs par3d[hf].")
    ap.add_argument("checkpoint", metavar="CHECKPOINT_DIR",
                    help="a checkpoint folder (step-N), or a run's --out / checkpoints folder (its newest)")
    ap.add_argument("--hf", required=True, metavar="OUT_DIR", help="the Hugging Face folder to write")
    ap.add_argument("--json", action="store_true", help="print what was written as JSON")
    ap.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from par3d import checkpoint
    from par3d.config import ConfigError

    try:
        path = checkpoint.resolve(args.checkpoint, args.checkpoint, what="CHECKPOINT_DIR")
        from par3d.hf import export

        out = export(path, args.hf)
    except ConfigError as e:
        print(f"par3d export: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"par3d export: needs the Hugging Face extra ({e}); pip install 'par3d[hf]'", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out))
    else:
        print(f"wrote {out['architecture']} ({out['tensors']} tensors, step {out['step']}) to {out['out']}")
    return 0
