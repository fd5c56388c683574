"""The planner's config.json reader against transformers itself: for each family a user plans, the default config of
transformers' own config class, written as a config.json and read by `resolve_model`, has the parameters transformers
builds from it (counted on the meta device: no memory, no weights).  A key the reader does not know shows here as a
wrong count instead of a silently mispriced plan.  Families the installed transformers lacks are skipped."""

from __future__ import annotations

import json

import pytest

from par3d.plan.models import resolve_model

FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "olmo2", "olmoe", "phi3",
            "gemma", "falcon", "gpt_neox", "gpt2", "opt", "bloom", "gpt_bigcode", "aria_text", "granitemoe",
            "ernie4_5_moe", "llama4_text", "minimax_m2", "bitnet", "doge", "starcoder2", "cohere", "deepseek_v3",
            # sliding-window layers among global ones (issue 12's fifty-eighth round)
            "gemma2", "gemma3_text", "vaultgemma", "olmo3", "cohere2", "exaone4",
            # ... and global from the first layer (issue 12's fifty-ninth round)
            "cwm", "granite_swa", "granitemoe_swa", "modernbert-decoder")


@pytest.mark.parametrize("model_type", FAMILIES)
def test_config_json_reads_as_transformers_builds_it(tmp_path, model_type):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    try:
        cfg = transformers.AutoConfig.for_model(model_type)
    except (KeyError, ValueError):
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    path = tmp_path / "config.json"
    path.write_text(cfg.to_json_string(use_diff=False))
    ours = resolve_model(str(path))
    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(cfg)
    theirs = sum(p.numel() for p in built.parameters())  # a tied embedding once, as params() counts it
    # DeepSeek-V3's multi-token-prediction layer is priced (ModelSpec.mtp_layers); transformers does not build it
    extra = ours.mtp_layers * (ours.layer_params() + 2 * ours.hidden * ours.hidden) if ours.mtp_layers else 0
    assert (ours.params() - extra) == pytest.approx(theirs, rel=0.005), json.dumps(
        {"ours": ours.params(), "theirs": theirs, "model": repr(ours)})
