"""README's commands run as written (issue 14, item 5): every `par3d ...` line of README.md's code
blocks is executed here, so the README cannot drift from the code.

Each command runs in one of three ways, chosen by the longest matching prefix in HOW:
  "run"      as written (the ones that finish in seconds);
  "dry"      with `--dry-run` appended: every check `par3d train` makes before starting processes
             (configuration, data, outputs, memory), without training — for runs too long for
             the suite (the training paths themselves are tested against the reference elsewhere);
  "parse"    parsed by the CLI's own parser and every file it names checked to exist — for the
             measurement commands (calibrate, bench: minutes even with --quick; tests/test_calibrate.py,
             test_fidelity.py and test_bench_peers.py run them).
A README line whose subcommand has no entry fails the test: add its prefix to HOW.  Commands run
in README order in one scratch folder holding the files the README refers to (FILES)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

HOW: dict[str, str] = {
    "par3d train": "dry",
    "par3d train --dp 2 --steps 5": "run",  # two ranks, five steps: a few seconds
    "par3d plan": "run",
    "par3d simulate": "run",
    "par3d calibrate": "parse",
    "par3d bench": "parse",
    # these need a Hugging Face checkpoint folder (hf_llama/) or a trained run: tests/test_hf.py runs them
    "par3d eval": "parse",
    "par3d export": "parse",
    "par3d train --init-from": "parse",
}

# files README's commands read, made in the scratch folder before the first command
FILES: dict[str, str] = {
    "run.toml": "[parallel]\ndp = 2\n\n[train]\nsteps = 2\n",
    "path/to/config.json": json.dumps({"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4,
                                       "n_positions": 512, "vocab_size": 50257}),
    # Qwen3-30B-A3B's config.json (its Hugging Face card's architecture; the MoE keys the planner reads)
    "path/to/Qwen3-30B-A3B/config.json": json.dumps({
        "model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 4096,
        "decoder_sparse_step": 1, "mlp_only_layers": []}),
}
COPIED = ["benchmarks/results/hardware-cpu.json"]


def readme_commands() -> list[str]:
    """Every line of a fenced code block that starts with `par3d `, without its trailing comment."""
    out, in_block, cont = [], False, None
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            in_block, cont = not in_block, None
            continue
        if in_block and cont is not None:  # a continued line (trailing backslash)
            out[-1] += " " + re.sub(r"\s+#.*$", "", line).strip().removesuffix("\\").strip()
            cont = line.rstrip().endswith("\\") or None
            continue
        if in_block and line.startswith("par3d "):
            out.append(re.sub(r"\s+#.*$", "", line).strip().removesuffix("\\").strip())
            cont = line.rstrip().endswith("\\") or None
    return out


def how(cmd: str) -> str:
    words = shlex.split(cmd)
    best = max((k for k in HOW if words[:len(k.split())] == k.split()), key=lambda k: len(k.split()), default=None)
    if best is None:
        raise AssertionError(f"README command {cmd!r} has no entry in tests/test_readme.py HOW: add its prefix "
                             f"with 'run', 'dry' or 'parse'")
    return HOW[best]


COMMANDS = readme_commands()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("readme")
    for name, text in FILES.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    for name in COPIED:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, d / name)
    return d


def test_the_readme_has_commands_of_every_kind():
    assert len(COMMANDS) >= 15
    assert {how(c) for c in COMMANDS} == {"run", "dry", "parse"}


@pytest.mark.parametrize("cmd", COMMANDS)
def test_readme_command_runs_as_written(cmd, scratch):
    mode = how(cmd)
    argv = shlex.split(cmd)[1:]
    if mode == "parse":
        from par3d.cli import build_parser

        args = build_parser().parse_args(argv)  # exits (SystemExit) on an unknown flag
        assert getattr(args, "func", None) is not None, cmd
        for name in ("hardware", "config"):
            path = getattr(args, name, None)
            assert path is None or (scratch / path).exists(), f"{cmd}: {path} does not exist"
        return
    if mode == "dry":
        argv.append("--dry-run")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, "-m", "par3d", *argv], capture_output=True, text=True, cwd=scratch,
                       timeout=120, env=env)
    assert r.returncode == 0, f"{cmd} ({mode}):\n{r.stderr[-3000:]}"
    if mode == "dry":
        assert "configuration ok" in r.stdout, r.stdout
