"""Hugging Face at the edges: read a `config.json` into a ModelConfig, load a safetensors checkpoint
into any layout (each rank reading only its slices), export a par3d checkpoint as config.json +
safetensors that `transformers.AutoModelForCausalLM.from_pretrained` loads.

This module (with the tokenizer in data.py) is the only one that imports the optional `hf` extra
(`pip install par3d[hf]`): safetensors here, transformers never (the files are its format, not its
code).  Inside par3d parameters keep par3d's names (DESIGN.md idea 5); the name map below says
which Hugging Face tensors each one is made of:

    par3d                         LlamaForCausalLM (model.)        GPT2LMHeadModel (transformer.)
    embedding.tok.weight          embed_tokens.weight              wte.weight
    embedding.pos                 -                                wpe.weight
    blocks.i.ln1 / ln2            layers.i.input_layernorm /       h.i.ln_1 / ln_2
                                  post_attention_layernorm
    blocks.i.attn.qkv             q_proj | k_proj | v_proj         attn.c_attn (Conv1D: transposed)
      (GQA: attn.q, attn.kv)      q_proj ; k_proj | v_proj
    blocks.i.attn.proj            o_proj                           attn.c_proj
    blocks.i.mlp.fc1              gate_proj | up_proj              mlp.c_fc
    blocks.i.mlp.fc2              down_proj                        mlp.c_proj
    head.ln_f                     norm                             ln_f
    head.weight                   lm_head.weight (tied: embed)     lm_head.weight (tied: wte)

A par3d tensor is the concatenation along its output rows of the Hugging Face tensors named
("|"); a rank's slice of it (TP rows in stride blocks, TP columns, vocabulary rows) is read with
safetensors' lazy slicing, so no rank ever holds a full copy of a tensor it shards.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from par3d.config import ConfigError, ModelConfig

_VOCAB_PARAMS = ("embedding.tok.weight", "head.weight")


# ---- tokenizer ---------------------------------------------------------------------------------------------

class HFTokenizer:
    """A Hugging Face `tokenizer.json` (the `tokenizers` library); `data.Corpus` packs documents with
    its end-of-text token (the first of data.EOT_NAMES it knows)."""

    def __init__(self, path: str):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ValueError("--tokenizer needs the tokenizers package: pip install 'par3d[hf]'") from None
        file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        try:
            self.tok = Tokenizer.from_file(file)
        except Exception as e:  # the library raises its own exception types
            raise ValueError(f"--tokenizer {path!r}: not a readable tokenizer.json ({e})") from None
        with open(file, "rb") as fh:
            self.digest = hashlib.sha256(fh.read()).hexdigest()[:16]
        self.vocab = int(self.tok.get_vocab_size(with_added_tokens=True))
        from par3d.data import EOT_NAMES

        ids = [self.tok.token_to_id(n) for n in EOT_NAMES]
        found = [i for i in ids if i is not None]
        if not found:
            raise ValueError(f"--tokenizer {path!r} has no end-of-text token (looked for {', '.join(EOT_NAMES)})")
        self.eot = int(found[0])

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids


# ---- config.json <-> ModelConfig (no torch) ---------------------------------------------------------

def read_hf_config(path: str) -> dict[str, Any]:
    """The `config.json` of a model folder (or the file itself).  Raises ConfigError."""
    cfg_path = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(cfg_path, encoding="utf-8") as fh:
            d = json.load(fh)
    except (OSError, ValueError) as e:
        raise ConfigError([f"{path!r}: cannot read a Hugging Face config.json ({e}); give a folder written "
                           f"by save_pretrained or its config.json"]) from None
    if not isinstance(d, dict):
        raise ConfigError([f"{cfg_path!r} is not a JSON object"])
    return d


def model_config_from_hf(d: dict[str, Any], seq_len: int | None = None, where: str = "config.json") -> ModelConfig:
    """A ModelConfig equal to the Hugging Face model described by `d` (llama/mistral-style or gpt2)."""
    kind = d.get("model_type")
    if kind in ("llama", "mistral"):
        heads = int(d["num_attention_heads"])
        bias = bool(d.get("attention_bias", False))
        if bool(d.get("mlp_bias", False)) != bias:
            raise ConfigError([f"{where}: attention_bias={bias} but mlp_bias={d.get('mlp_bias')}; par3d has "
                               f"one bias switch for every linear layer"])
        if d.get("rope_scaling") or (d.get("rope_parameters") or {}).get("rope_type", "default") != "default":
            raise ConfigError([f"{where}: rope scaling ({d.get('rope_scaling') or d.get('rope_parameters')}) "
                               f"is not supported; only plain rotary embeddings"])
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError([f"{where}: hidden_act={d.get('hidden_act')!r}; par3d's llama MLP is SwiGLU (silu)"])
        hidden = int(d["hidden_size"])
        if d.get("head_dim") not in (None, hidden // heads):
            raise ConfigError([f"{where}: head_dim={d['head_dim']} != hidden_size/num_attention_heads; "
                               f"not supported"])
        theta = d.get("rope_theta", (d.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        return ModelConfig(
            arch="llama", vocab=int(d["vocab_size"]), layers=int(d["num_hidden_layers"]), hidden=hidden,
            heads=heads, kv_heads=int(d.get("num_key_value_heads") or heads),
            ffn_hidden=int(d["intermediate_size"]), norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta), tied_embeddings=bool(d.get("tie_word_embeddings", False)), bias=bias,
            max_positions=int(d["max_position_embeddings"]) if "max_position_embeddings" in d else None,
            seq_len=seq_len or min(int(d.get("max_position_embeddings", 2048)), 2048)).fill_arch()
    if kind == "gpt2":
        act = d.get("activation_function", "gelu_new")
        acts = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
        if act not in acts:
            raise ConfigError([f"{where}: activation_function={act!r} is not supported; one of {', '.join(acts)}"])
        if d.get("scale_attn_by_inverse_layer_idx") or d.get("reorder_and_upcast_attn") or \
                not d.get("scale_attn_weights", True):
            raise ConfigError([f"{where}: GPT-2 attention variants (scale_attn_by_inverse_layer_idx, "
                               f"reorder_and_upcast_attn, scale_attn_weights=false) are not supported"])
        hidden, positions = int(d["n_embd"]), int(d.get("n_positions", 1024))
        return ModelConfig(
            arch="gpt", vocab=int(d["vocab_size"]), layers=int(d["n_layer"]), hidden=hidden,
            heads=int(d["n_head"]), ffn_hidden=int(d.get("n_inner") or 4 * hidden),
            norm_eps=float(d.get("layer_norm_epsilon", 1e-5)), activation=acts[act], max_positions=positions,
            tied_embeddings=bool(d.get("tie_word_embeddings", True)),
            seq_len=seq_len or min(positions, 1024)).fill_arch()
    raise ConfigError([f"{where}: model_type={kind!r} is not supported; par3d reads llama, mistral and gpt2 "
                       f"checkpoints"])


def hf_config_of(mc: ModelConfig) -> dict[str, Any]:
    """The Hugging Face config.json of a par3d model; raises ConfigError when no HF class matches."""
    mc.fill_arch()
    if mc.norm == "rmsnorm" and mc.position == "rope" and mc.gated_mlp and mc.activation == "silu":
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": mc.vocab,
            "hidden_size": mc.hidden, "intermediate_size": mc.ffn, "num_hidden_layers": mc.layers,
            "num_attention_heads": mc.heads, "num_key_value_heads": mc.kv, "head_dim": mc.head_dim,
            "hidden_act": "silu", "max_position_embeddings": mc.positions, "rms_norm_eps": mc.norm_eps,
            "rope_theta": mc.rope_theta, "attention_bias": bool(mc.bias), "mlp_bias": bool(mc.bias),
            "tie_word_embeddings": mc.tied_embeddings, "torch_dtype": "float32", "attention_dropout": 0.0,
            "bos_token_id": None, "eos_token_id": None,
        }
    if (mc.norm == "layernorm" and mc.position == "learned" and not mc.gated_mlp and mc.bias
            and mc.kv == mc.heads and mc.activation in ("gelu", "gelu_tanh")):
        return {
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": mc.vocab,
            "n_embd": mc.hidden, "n_layer": mc.layers, "n_head": mc.heads, "n_inner": mc.ffn,
            "n_positions": mc.positions, "layer_norm_epsilon": mc.norm_eps,
            "activation_function": "gelu_new" if mc.activation == "gelu_tanh" else "gelu",
            "tie_word_embeddings": mc.tied_embeddings, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
            "attn_pdrop": 0.0, "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": None,
        }
    raise ConfigError([f"model (arch={mc.arch}, norm={mc.norm}, position={mc.position}, gated_mlp="
                       f"{mc.gated_mlp}, activation={mc.activation}, bias={mc.bias}) matches neither "
                       f"LlamaForCausalLM nor GPT2LMHeadModel; it cannot be exported"])


# ---- the name map ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Part:
    """Rows [.., +rows) of a par3d tensor come from Hugging Face tensor `name` (transposed: Conv1D)."""

    name: str
    rows: int
    transposed: bool = False


def name_map(mc: ModelConfig, llama: bool, prefix: str = "") -> dict[str, list[Part]]:
    """par3d global parameter name -> the Hugging Face tensors it is the row-concatenation of."""
    mc.fill_arch()
    h, f, kvd, L = mc.hidden, mc.ffn, mc.kv * mc.head_dim, mc.layers
    out: dict[str, list[Part]] = {}
    if llama:
        p = prefix  # "model."
        out["embedding.tok.weight"] = [Part(p + "embed_tokens.weight", mc.vocab)]
        for i in range(L):
            b, hb = f"blocks.{i}.", f"{p}layers.{i}."
            out[b + "ln1.weight"] = [Part(hb + "input_layernorm.weight", h)]
            out[b + "ln2.weight"] = [Part(hb + "post_attention_layernorm.weight", h)]
            for suf in ("weight", "bias") if mc.bias else ("weight",):
                q = Part(hb + f"self_attn.q_proj.{suf}", h)
                k, v = Part(hb + f"self_attn.k_proj.{suf}", kvd), Part(hb + f"self_attn.v_proj.{suf}", kvd)
                if mc.kv == mc.heads:
                    out[b + f"attn.qkv.{suf}"] = [q, k, v]
                else:
                    out[b + f"attn.q.{suf}"], out[b + f"attn.kv.{suf}"] = [q], [k, v]
                out[b + f"attn.proj.{suf}"] = [Part(hb + f"self_attn.o_proj.{suf}", h)]
                out[b + f"mlp.fc1.{suf}"] = [Part(hb + f"mlp.gate_proj.{suf}", f), Part(hb + f"mlp.up_proj.{suf}", f)]
                out[b + f"mlp.fc2.{suf}"] = [Part(hb + f"mlp.down_proj.{suf}", h)]
        out["head.ln_f.weight"] = [Part(p + "norm.weight", h)]
        out["head.weight"] = [Part("lm_head.weight", mc.vocab)]
        return out
    p = prefix  # "transformer."
    out["embedding.tok.weight"] = [Part(p + "wte.weight", mc.vocab)]
    out["embedding.pos"] = [Part(p + "wpe.weight", mc.positions)]
    for i in range(L):
        b, hb = f"blocks.{i}.", f"{p}h.{i}."
        for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[b + ours + ".weight"] = [Part(hb + theirs + ".weight", h)]
            out[b + ours + ".bias"] = [Part(hb + theirs + ".bias", h)]
        for ours, theirs, rows in (("attn.qkv", "attn.c_attn", 3 * h), ("attn.proj", "attn.c_proj", h),
                                   ("mlp.fc1", "mlp.c_fc", f), ("mlp.fc2", "mlp.c_proj", h)):
            out[b + ours + ".weight"] = [Part(hb + theirs + ".weight", rows, transposed=True)]
            out[b + ours + ".bias"] = [Part(hb + theirs + ".bias", rows)]
    out["head.ln_f.weight"] = [Part(p + "ln_f.weight", h)]
    out["head.ln_f.bias"] = [Part(p + "ln_f.bias", h)]
    out["head.weight"] = [Part("lm_head.weight", mc.vocab)]
    return out


# ---- reading a safetensors checkpoint -----------------------------------------------------------------

class SafetensorsReader:
    """Lazy access to the tensors of a `save_pretrained` folder: `model.safetensors`, or the shards
    listed by `model.safetensors.index.json`.  Only the requested slices are read."""

    def __init__(self, path: str):
        from safetensors import safe_open

        self.path = path
        index = os.path.join(path, "model.safetensors.index.json")
        single = os.path.join(path, "model.safetensors")
        if os.path.isfile(index):
            with open(index, encoding="utf-8") as fh:
                weight_map = json.load(fh)["weight_map"]
            files = sorted(set(weight_map.values()))
        elif os.path.isfile(single):
            files, weight_map = ["model.safetensors"], None
        else:
            raise ConfigError([f"--init-from {path!r}: no model.safetensors or model.safetensors.index.json "
                               f"there; save the model with save_pretrained(..., safe_serialization=True)"])
        self._files = {fn: safe_open(os.path.join(path, fn), framework="pt") for fn in files}
        if weight_map is None:
            weight_map = {k: "model.safetensors" for k in self._files["model.safetensors"].keys()}  # noqa: SIM118
        self.weight_map: dict[str, str] = weight_map

    def has(self, name: str) -> bool:
        return name in self.weight_map

    def shape(self, name: str) -> list[int]:
        return list(self._files[self.weight_map[name]].get_slice(name).get_shape())

    def rows(self, part: Part, lo: int, hi: int, cols: tuple[int, int] | None = None) -> Any:
        """Rows [lo, hi) (and columns `cols`) of `part` in par3d's orientation, as fp32."""
        sl = self._files[self.weight_map[part.name]].get_slice(part.name)
        if part.transposed:  # Conv1D stores [in, out]: par3d's rows are its columns
            t = sl[:, lo:hi] if cols is None else sl[cols[0]:cols[1], lo:hi]
            return t.t().float()
        if len(sl.get_shape()) == 1:
            return sl[lo:hi].float()
        return (sl[lo:hi] if cols is None else sl[lo:hi, cols[0]:cols[1]]).float()

    def full(self, name: str) -> Any:
        return self._files[self.weight_map[name]].get_tensor(name)


def _detect(reader: SafetensorsReader, llama: bool) -> str:
    """The prefix of the base model's tensor names ("model.", "transformer." or none)."""
    probe = "embed_tokens.weight" if llama else "wte.weight"
    for prefix in (("model.", "") if llama else ("transformer.", "")):
        if reader.has(prefix + probe):
            return prefix
    raise ConfigError([f"--init-from {reader.path!r}: no tensor {probe} (with or without a prefix); is it a "
                       f"{'LlamaForCausalLM' if llama else 'GPT2LMHeadModel'} checkpoint?"])


def _row_ranges(param: Any, name: str, tp: Any, vocab: int, full_rows: int) -> list[tuple[int, int]] | None:
    """The ranges of full-tensor rows this TP rank holds (None: all of them, or a column slice)."""
    from par3d.tensor_parallel import padded_vocab

    if not getattr(param, "tp_sharded", False) or tp.size == 1 or param.shard_dim != 0:
        return None
    if name in _VOCAB_PARAMS:
        per = padded_vocab(vocab, tp.size) // tp.size
        return [(tp.rank * per, (tp.rank + 1) * per)]
    stride = param.shard_stride
    block = full_rows // stride
    n = block // tp.size
    return [(b * block + tp.rank * n, b * block + (tp.rank + 1) * n) for b in range(stride)]


def _read(reader: SafetensorsReader, parts: list[Part], ranges: list[tuple[int, int]],
          cols: tuple[int, int] | None, shape: tuple[int, ...]) -> Any:
    """Rows `ranges` of the row-concatenation of `parts`, into a tensor of `shape` (rows past the
    last part stay zero: the padding of a vocabulary-parallel table)."""
    import torch

    out = torch.zeros(shape)
    at = 0
    for lo, hi in ranges:
        start = 0
        for part in parts:
            a, b = max(lo, start), min(hi, start + part.rows)
            if a < b:
                piece = reader.rows(part, a - start, b - start, cols)
                if tuple(piece.shape[1:]) != tuple(shape[1:]):
                    raise ConfigError([f"--init-from {reader.path!r}: {part.name} has rows of shape "
                                       f"{tuple(piece.shape[1:])}, par3d expects {tuple(shape[1:])}"])
                out[at + a - lo:at + b - lo] = piece
            start += part.rows
        at += hi - lo
    if at != shape[0]:
        raise ConfigError([f"--init-from {reader.path!r}: read {at} rows for a tensor of shape {tuple(shape)}"])
    return out


def load_into(path: str, chunks: list[Any], tp: Any, mc: ModelConfig) -> int:
    """Copy Hugging Face weights from folder `path` into this rank's parameters (any layout): each
    parameter reads only its own TP slice.  Returns the number of tensors read."""
    import torch

    from par3d.model import global_named_parameters

    d = read_hf_config(path)
    llama = d.get("model_type") != "gpt2"
    check_matches(model_config_from_hf(d, mc.seq_len, path), mc, path)
    reader = SafetensorsReader(path)
    nmap = name_map(mc, llama, _detect(reader, llama))
    if not reader.has("lm_head.weight") or mc.tied_embeddings:  # tied: the head is the embedding
        nmap["head.weight"] = nmap["embedding.tok.weight"]
    count = 0
    with torch.no_grad():
        for chunk in chunks:
            for name, param in global_named_parameters(chunk):
                parts = nmap.get(name)
                if parts is None:
                    raise ConfigError([f"--init-from {path!r}: par3d parameter {name} has no Hugging Face "
                                       f"counterpart"])
                missing = [pt.name for pt in parts if not reader.has(pt.name)]
                if missing:
                    raise ConfigError([f"--init-from {path!r}: tensor {missing[0]} is missing"])
                full_rows = sum(pt.rows for pt in parts)
                ranges = _row_ranges(param, name, tp, mc.vocab, full_rows)
                cols = None
                if getattr(param, "tp_sharded", False) and param.shard_dim == 1 and tp.size > 1:
                    n = param.shape[1]
                    cols = (tp.rank * n, (tp.rank + 1) * n)
                for pt in parts:  # the checkpoint's tensors must have the sizes config.json implies
                    have = reader.shape(pt.name)
                    if (have[-1] if pt.transposed else have[0]) != pt.rows:
                        raise ConfigError([f"--init-from {path!r}: {pt.name} has shape {have}, expected "
                                           f"{pt.rows} {'columns' if pt.transposed else 'rows'}"])
                local = _read(reader, parts, ranges or [(0, full_rows)], cols, tuple(param.shape))
                param.copy_(local.to(param.dtype))
                count += 1
    return count


_SHAPE_FIELDS = ("arch", "vocab", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "norm", "position",
                 "gated_mlp", "activation", "bias", "tied_embeddings")


def check_matches(hf: ModelConfig, mc: ModelConfig, path: str) -> None:
    """The run's model must be the checkpoint's (the CLI copies it from config.json; this guards the rest)."""
    hf.fill_arch()
    mc.fill_arch()
    bad = [f"{k}: checkpoint {getattr(hf, k)!r}, run {getattr(mc, k)!r}" for k in _SHAPE_FIELDS
           if (hf.kv if k == "kv_heads" else hf.ffn if k == "ffn_hidden" else getattr(hf, k))
           != (mc.kv if k == "kv_heads" else mc.ffn if k == "ffn_hidden" else getattr(mc, k))]
    if hf.position == "learned" and mc.positions != hf.positions:
        bad.append(f"max_positions: checkpoint {hf.positions}, run {mc.positions}")
    if bad:
        raise ConfigError([f"--init-from {path!r}: the model differs from the checkpoint's ({'; '.join(bad)}); "
                           f"drop the model flags so par3d takes them from its config.json"])


# ---- export ------------------------------------------------------------------------------------------------

def hf_tensors(full: dict[str, Any], mc: ModelConfig) -> dict[str, Any]:
    """Hugging Face tensors from par3d's full tensors (by global name) — the inverse of the name map."""
    llama = hf_config_of(mc)["model_type"] == "llama"
    nmap = name_map(mc, llama, "model." if llama else "transformer.")
    out: dict[str, Any] = {}
    for name, parts in nmap.items():
        if name == "head.weight" and mc.tied_embeddings:
            continue  # tied: transformers re-ties lm_head to the embedding
        t = full[name]
        start = 0
        for part in parts:
            piece = t[start:start + part.rows]
            out[part.name] = (piece.t() if part.transposed else piece).contiguous()
            start += part.rows
    return out


def export(checkpoint_dir: str, out_dir: str) -> dict[str, Any]:
    """Write `out_dir/config.json` + `model.safetensors` from a par3d checkpoint (any layout wrote it:
    its tensors are stored whole).  Runs in one process, reads only the model's weights."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint import FileSystemReader

    from par3d import checkpoint

    man = checkpoint.read_manifest(checkpoint_dir)
    known = {f for f in ModelConfig.__dataclass_fields__}
    mc = ModelConfig(**{k: v for k, v in man["config"]["model"].items() if k in known}).fill_arch()
    hf_cfg = hf_config_of(mc)
    names = [k[len("model/"):] for k in man["tensors"] if k.startswith("model/")]
    state = {f"model/{n}": torch.empty(man["tensors"][f"model/{n}"], dtype=torch.float32) for n in names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=FileSystemReader(checkpoint_dir), no_dist=True)
    full = {n: state[f"model/{n}"] for n in names}
    if mc.tied_embeddings:
        full.setdefault("head.weight", full["embedding.tok.weight"])
    tensors = hf_tensors(full, mc)
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(hf_cfg, fh, indent=2)
    return {"out": out_dir, "architecture": hf_cfg["architectures"][0], "tensors": len(tensors),
            "step": man["step"], "layout": man["layout"]}
