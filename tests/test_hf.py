"""Hugging Face interop (issue 15): tiny random LlamaForCausalLM (4 layers, hidden 64, 4 heads, 2 K/V
heads) and GPT2LMHeadModel built with transformers here (no download) and saved with save_pretrained.

- `par3d eval --init-from` gives transformers' loss on the same tokens within 1e-4 under
  (dp, pp, tp) = (1,1,1), (1,1,2), (1,2,1), (2,2,2) (and tp 4 > kv_heads 2: replicated K/V heads);
- 3 training steps under (1,2,2) from the Llama checkpoint, `par3d export`, reload in transformers:
  its logits equal par3d's within 1e-4, and `par3d eval --resume` scores the checkpoint as
  transformers scores the export;
- each rank reads only its slices; a sharded (index) checkpoint loads like a single file;
- `par3d plan --emit-config --emit-smoke` of a catalogue llama writes a config that trains.

One world of 8 gloo ranks runs every evaluation and training run (module fixture)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from distributed_helper import run_world

transformers = pytest.importorskip("transformers")

TOL = 1e-4
LAYOUTS = [(1, 1, 1), (1, 1, 2), (1, 2, 1), (2, 2, 2)]
SEQ, BATCH, N_BATCHES = 32, 4, 2


def _llama(path: str) -> None:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=301, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   tie_word_embeddings=False, rms_norm_eps=1e-5, rope_theta=10000.0,
                                   initializer_range=0.1)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)


def _gpt2(path: str, shard: bool) -> None:
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(vocab_size=300, n_embd=64, n_layer=4, n_head=4, n_positions=64,
                                  bos_token_id=0, eos_token_id=0, initializer_range=0.1)
    m = transformers.GPT2LMHeadModel(cfg)
    m.save_pretrained(path, max_shard_size="100KB" if shard else "10GB")


def _hf_loss(path: str, data: str) -> float:
    from par3d.data import Corpus, eval_batch

    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    corpus = Corpus.load(data)
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(N_BATCHES):
            x, y = (torch.from_numpy(t) for t in eval_batch(corpus, i, BATCH, SEQ))
            logits = model(x).logits
            total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"))
            n += y.numel()
    return total / n


def _eval_cfg(init_from: str, data: str, dp: int, pp: int, tp: int) -> dict:
    from par3d.commands.eval import config_from_args

    ns = argparse.Namespace(init_from=init_from, resume=None, data=data, tokenizer=None, eval_batches=N_BATCHES,
                            global_batch=BATCH, seq_len=SEQ, dp=dp, pp=pp, tp=tp, virtual_stages=None,
                            sequence_parallel=tp > 1, dtype=None, timeout_s=60.0, threads_per_rank=1)
    cfg, _ = config_from_args(ns)
    return cfg.to_dict()


def _train_cfg(argv: list[str]) -> dict:
    from par3d.cli import build_parser
    from par3d.commands.train import config_from_args

    cfg = config_from_args(build_parser().parse_args(["train", *argv]))
    cfg.validate()
    return cfg.to_dict()


def _world(evals: list, trains: list) -> dict:
    """Every rank: each evaluation and training run; what this rank holds of each."""
    from par3d.evaluate import eval_worker
    from par3d.train import worker

    out: dict = {}
    for name, cfg in evals:
        r = eval_worker(cfg, {"eval_batches": N_BATCHES})
        if not r.get("idle"):
            out[name] = r
    for name, cfg in trains:
        r = worker(cfg, {"quiet": True, "capture_params": True})
        if not r.get("idle"):
            out[name] = {k: r.get(k) for k in ("rank", "history", "params", "checkpoints")}
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    data = root / "text.txt"
    data.write_bytes(("The quick brown fox jumps over the lazy dog. " * 40).encode()
                     + bytes(range(32, 127)) * 4)
    paths = {"llama": str(root / "llama"), "gpt2": str(root / "gpt2"), "gpt2_sharded": str(root / "gpt2s")}
    _llama(paths["llama"])
    _gpt2(paths["gpt2"], shard=False)
    _gpt2(paths["gpt2_sharded"], shard=True)
    evals = [(f"{kind}_{dp}{pp}{tp}", _eval_cfg(paths[kind], str(data), dp, pp, tp))
             for kind in ("llama", "gpt2") for dp, pp, tp in LAYOUTS]
    evals += [("llama_tp4", _eval_cfg(paths["llama"], str(data), 1, 1, 4)),
              ("gpt2_sharded_122", _eval_cfg(paths["gpt2_sharded"], str(data), 1, 2, 2))]
    out = str(root / "run")
    trains = [("train_122", _train_cfg(["--init-from", paths["llama"], "--dp", "1", "--pp", "2", "--tp", "2",
                                        "--data", str(data), "--seq-len", str(SEQ), "--global-batch", "4",
                                        "--steps", "3", "--save-every", "3", "--lr", "1e-3", "--warmup", "0",
                                        "--out", out, "--no-progress"]))]
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["The quick brown fox jumps over the lazy dog."] * 20,
                            trainer=trainers.BpeTrainer(vocab_size=100, special_tokens=["<unk>", "<|endoftext|>"]))
    tok.save(str(root / "tokenizer.json"))
    trains.append(("tokenizer_tp2", _train_cfg(
        ["--tokenizer", str(root / "tokenizer.json"), "--data", str(data), "--vocab", str(tok.get_vocab_size()),
         "--tp", "2", "--layers", "2", "--hidden", "32", "--heads", "4", "--seq-len", "16", "--global-batch", "4",
         "--steps", "3", "--warmup", "0", "--out", str(root / "tok"), "--no-progress"])))
    smoke = root / "smoke.toml"
    from par3d.cli import main

    # tp, pp and cp pinned so the smoke layout stays the same while the planner's ranking evolves
    assert main(["plan", "--model", "llama3-8b", "--gpus", "4", "--tp", "2", "--pp", "2", "--cp", "1",
                 "--emit-config", str(smoke), "--emit-smoke"]) == 0
    scfg = _train_cfg(["--config", str(smoke), "--out", str(root / "smoke"), "--no-progress"])
    trains.append(("smoke", scfg))
    world = run_world(_world, 8, evals, trains, timeout_s=240)
    refs = {kind: _hf_loss(paths[kind], str(data)) for kind in ("llama", "gpt2")}
    return {"world": world, "refs": refs, "paths": paths, "data": str(data), "root": root, "out": out,
            "smoke": scfg}


def _rank0(world, name):
    return next(r[name] for r in world if name in r and r[name]["rank"] == 0)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_eval_matches_transformers(setup, kind, layout):
    name = f"{kind}_{''.join(map(str, layout))}"
    got = _rank0(setup["world"], name)
    assert got["tokens"] == N_BATCHES * BATCH * SEQ
    assert abs(got["loss"] - setup["refs"][kind]) <= TOL, (name, got["loss"], setup["refs"][kind])
    # every rank of the layout reports the same number (it was all-reduced)
    assert len({r[name]["loss"] for r in setup["world"] if name in r}) == 1


def test_replicated_kv_heads_and_sharded_index_load(setup):
    assert abs(_rank0(setup["world"], "llama_tp4")["loss"] - setup["refs"]["llama"]) <= TOL
    assert os.path.exists(os.path.join(setup["paths"]["gpt2_sharded"], "model.safetensors.index.json"))
    assert abs(_rank0(setup["world"], "gpt2_sharded_122")["loss"] - setup["refs"]["gpt2"]) <= TOL


def test_each_rank_reads_only_its_slices(setup, monkeypatch):
    """Count the elements read through safetensors' slicing: a tp=2 rank reads about half of what
    a tp=1 rank reads (only replicated norms and biases are read whole)."""
    from par3d import hf
    from par3d.config import model_config_from_name
    from par3d.mesh import Group
    from par3d.model import GPTStage, ModelContext

    read: list[int] = []
    orig = hf.SafetensorsReader.rows

    def counting(self, part, lo, hi, cols=None):
        t = orig(self, part, lo, hi, cols)
        read.append(t.numel())
        return t

    monkeypatch.setattr(hf.SafetensorsReader, "rows", counting)
    mc = model_config_from_name(setup["paths"]["llama"], SEQ)
    totals = []
    for tp in (1, 2):
        read.clear()
        ctx = ModelContext(tp=Group("tp", list(range(tp)), 0))
        hf.load_into(setup["paths"]["llama"], [GPTStage(mc, ctx)], ctx.tp, mc)
        totals.append(sum(read))
    assert totals[0] == sum(p.numel() for p in GPTStage(mc, ModelContext(tp=Group("tp", [0], 0))).parameters())
    assert totals[1] < 0.55 * totals[0], totals


def test_train_export_reload_logits_match(setup, tmp_path):
    from par3d.cli import main
    from par3d.config import model_config_from_name
    from par3d.mesh import Group
    from par3d.model import GPTStage, ModelContext

    world = setup["world"]
    hist = _rank0(world, "train_122")["history"]
    assert len(hist) == 3 and hist[-1]["loss"] < hist[0]["loss"]
    ckpts = _rank0(world, "train_122")["checkpoints"]
    assert ckpts and ckpts[-1].endswith("step-00000003")
    # the trained parameters, gathered from every layout rank, into a one-process par3d model
    params = {}
    for r in world:
        if "train_122" in r and r["train_122"].get("params"):
            params.update(r["train_122"]["params"])
    mc = model_config_from_name(setup["paths"]["llama"], SEQ)
    ours = GPTStage(mc, ModelContext(tp=Group("tp", [0], 0)))
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(params[name])
    out = str(tmp_path / "exported")
    assert main(["export", ckpts[-1], "--hf", out, "--json"]) == 0
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(theirs).__name__ == "LlamaForCausalLM"
    with open(os.path.join(out, "config.json")) as fh:  # what the import read is what the export declares
        exported = json.load(fh)
    assert exported["max_position_embeddings"] == 128 and exported["num_key_value_heads"] == 2
    x = torch.from_numpy(np.frombuffer(b"Exported from a (1,2,2) layout, reloaded.", dtype=np.uint8)
                         .astype(np.int64)[:SEQ]).unsqueeze(0)
    with torch.no_grad():
        a, b = ours.logits(x), theirs(x).logits
    assert float((a - b).abs().max()) <= TOL
    # and the trained weights moved away from the imported ones
    before = transformers.AutoModelForCausalLM.from_pretrained(setup["paths"]["llama"]).eval()
    with torch.no_grad():
        assert float((before(x).logits - b).abs().max()) > 1e-3


def test_eval_resume_of_the_trained_checkpoint_equals_transformers_on_its_export(setup, tmp_path):
    """`par3d eval --resume` (another layout than the one that trained) scores the trained weights
    exactly as transformers scores the exported folder."""
    from par3d.cli import main

    ckpt = _rank0(setup["world"], "train_122")["checkpoints"][-1]
    out = str(tmp_path / "exported")
    assert main(["export", ckpt, "--hf", out]) == 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-m", "par3d", "eval", "--resume", ckpt, "--data", setup["data"],
                           "--pp", "2", "--global-batch", str(BATCH), "--eval-batches", str(N_BATCHES), "--json"],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert abs(got["loss"] - _hf_loss(out, setup["data"])) <= TOL
    assert abs(got["loss"] - setup["refs"]["llama"]) > 1e-3  # trained: not the imported model's loss


def test_export_gpt2_from_a_par3d_checkpoint_roundtrips(setup, tmp_path):
    """A GPT trained by par3d from scratch (exact GeLU, untied) exports as GPT2LMHeadModel."""
    from par3d import hf
    from par3d.config import ModelConfig

    mc = ModelConfig(vocab=300, seq_len=16, layers=2, hidden=32, heads=4, ffn_hidden=128, max_positions=16).fill_arch()
    cfg = hf.hf_config_of(mc)
    assert cfg["model_type"] == "gpt2" and cfg["activation_function"] == "gelu"
    assert hf.model_config_from_hf(cfg, 16) == mc
    with pytest.raises(Exception, match="cannot be exported"):
        hf.hf_config_of(ModelConfig(norm="rmsnorm").fill_arch())


def test_emit_smoke_config_trains(setup):
    cfg = setup["smoke"]
    assert cfg["model"]["arch"] == "llama" and cfg["model"]["kv_heads"] is not None
    hist = _rank0(setup["world"], "smoke")["history"]
    assert len(hist) == 3 and all(np.isfinite(h["loss"]) for h in hist)


def test_training_with_a_tokenizer(setup):
    hist = _rank0(setup["world"], "tokenizer_tp2")["history"]
    assert len(hist) == 3 and hist[-1]["loss"] < hist[0]["loss"]
    assert any(f.endswith(".bin") for f in os.listdir(setup["root"]))  # tokenized once, next to the text


def test_eval_cli_end_to_end(setup):
    """The command itself (a fresh 2-rank world): --json prints {"loss", "tokens"}."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-m", "par3d", "eval", "--init-from", setup["paths"]["gpt2"],
                           "--data", setup["data"], "--tp", "2", "--seq-len", str(SEQ), "--global-batch",
                           str(BATCH), "--eval-batches", str(N_BATCHES), "--json"],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out) == {"loss", "tokens"} and abs(out["loss"] - setup["refs"]["gpt2"]) <= TOL


def test_export_names_its_own_argument_when_the_folder_is_missing(tmp_path, capsys):
    """`par3d export` takes the checkpoint folder as CHECKPOINT_DIR; a missing one is refused naming that, not
    --resume (a flag export does not have)."""
    from par3d.cli import main

    assert main(["export", str(tmp_path / "nope"), "--hf", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"CHECKPOINT_DIR '{tmp_path / 'nope'}': no such folder" in err and "--resume" not in err
