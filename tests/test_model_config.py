"""The architecture switches of ModelConfig (no torch): arch defaults, validation of the GQA/TP
rules with a fix in the message, the planner's catalogue as runtime configs, the smoke shrink."""

from __future__ import annotations

import pytest

from par3d.config import (
    ConfigError,
    ModelConfig,
    ParallelConfig,
    RunConfig,
    model_config_from_name,
    smoke_model,
)
from par3d.plan.models import CATALOGUE


def _cfg(tp: int = 1, **model) -> RunConfig:
    return RunConfig(model=ModelConfig(**model), parallel=ParallelConfig(tp=tp))


def test_arch_fills_only_the_unset_switches():
    m = ModelConfig(arch="llama", bias=True).fill_arch()
    assert (m.norm, m.position, m.gated_mlp, m.activation, m.bias) == ("rmsnorm", "rope", True, "silu", True)
    g = ModelConfig().fill_arch()
    assert (g.norm, g.position, g.gated_mlp, g.activation, g.bias) == ("layernorm", "learned", False, "gelu", True)


@pytest.mark.parametrize("tp,kv,ok", [(1, 2, True), (2, 2, True), (4, 2, True), (4, 4, True), (2, 1, True),
                                      (4, 3, False), (2, 3, False)])
def test_kv_heads_split_or_replicated_over_tp(tp, kv, ok):
    cfg = _cfg(tp=tp, arch="llama", heads=12 if kv == 3 else 4, hidden=48 if kv == 3 else 64, kv_heads=kv)
    if ok:
        cfg.validate()
    else:
        with pytest.raises(ConfigError, match="kv_heads"):
            cfg.validate()


@pytest.mark.parametrize("model,match", [
    (dict(arch="mamba"), "model.arch='mamba' is unknown"),
    (dict(norm="batchnorm"), "model.norm='batchnorm' is unknown"),
    (dict(heads=4, kv_heads=3), "kv_heads=3 must divide heads=4"),
    (dict(position="rope", hidden=60, heads=4, ffn_hidden=64), "even head dimension"),
    (dict(max_positions=32, seq_len=64), "max_positions=32 < seq_len=64"),
])
def test_bad_architecture_is_named_with_a_fix(model, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(**model).validate()


@pytest.mark.parametrize("name", [n for n in CATALOGUE if n.startswith("llama") and not CATALOGUE[n].moe])
def test_catalogue_llamas_are_runtime_configs_and_shrink_validly(name):
    mc = model_config_from_name(name)
    spec = CATALOGUE[name]
    assert mc.arch == "llama" and mc.kv == spec.kv and mc.ffn == spec.ffn and not mc.tied_embeddings
    assert mc.rope_theta == (500000.0 if name.startswith("llama3") else 10000.0)
    for tp in (1, 2, 4, 8):
        if spec.heads % tp or (spec.kv < tp and tp % spec.kv):
            continue
        small = smoke_model(mc, tp, 4)
        RunConfig(model=small, parallel=ParallelConfig(tp=tp, pp=2, virtual_stages=2, schedule="interleaved",
                                                       microbatches=2, sequence_parallel=True)).validate()
        assert small.arch == "llama" and small.layers == 4 and small.vocab == 256


@pytest.mark.parametrize("name,lacks", [("mixtral-8x7b", "routed experts"), ("deepseek-v3", "routed experts"),
                                        ("llama4-maverick", "routed experts"),
                                        ("bloom-176b", "ALiBi"), ("nemotron4-15b", "squared-ReLU")])
def test_catalogue_models_the_runtime_cannot_build_are_refused(name, lacks):
    """The planner's catalogue holds models par3d train cannot build as they are (issue 12's twenty-eighth round):
    asked to train one, the runtime names what it lacks instead of building another model under its name."""
    with pytest.raises(ConfigError, match=lacks):
        model_config_from_name(name)


def test_unknown_model_name_lists_the_catalogue():
    with pytest.raises(ConfigError, match="llama3-8b"):
        model_config_from_name("no-such-model")


def test_hugging_face_packages_are_imported_only_when_used():
    """transformers is never imported; safetensors and tokenizers only inside hf.py's functions."""
    import subprocess
    import sys

    code = ("import sys; import par3d.cli, par3d.train, par3d.data, par3d.model, par3d.evaluate, "
            "par3d.checkpoint, par3d.hf; from par3d.data import Corpus; Corpus.load(); "
            "par3d.cli.build_parser().parse_args(['eval', '--init-from', 'x', '--data', 'y']); "
            "bad = [m for m in ('transformers', 'safetensors', 'tokenizers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_windowed_model_is_not_built_as_full_attention(tmp_path):
    """A model with a sliding window on every layer (Mistral 7B v0.1's config.json; the planner prices it since issue 12's
    twenty-ninth round) is refused by the runtime, which has no local attention, rather than built with full attention."""
    import json

    from par3d.config import model_config_from_spec
    from par3d.plan.models import resolve_model

    cfg = {"model_type": "mistral", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "hidden_act": "silu",
           "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "sliding_window": 1024}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="local attention"):
        model_config_from_spec(resolve_model(str(p)))
    p.write_text(json.dumps({**cfg, "sliding_window": None}))
    assert model_config_from_spec(resolve_model(str(p))).layers == 2  # no window: built as before
    p.write_text(json.dumps({**cfg, "sliding_window": 4096}))  # a window as long as the sequence: full attention
    assert model_config_from_spec(resolve_model(str(p))).layers == 2
