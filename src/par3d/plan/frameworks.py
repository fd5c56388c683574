"""Named frameworks: the software facts `par3d plan` prices, bundled as each framework's own performance
configurations set them (`par3d plan --framework NAME`).

A plan for another framework's run is as good as what the planner is told that framework does (docs/planner.md
§9: the published runs priced from their model, cluster and layout alone fall from 924 to 688 within ±10 %).  The
facts are many -- whether pipeline sends block, how DP gradients are reduced, which loss and attention kernels run,
whether TP communication is overlapped -- and a user knows the framework, not its flags.  A `Framework` is that
bundle: the same `hardware.Cluster` fields a validation row states (validation.py's `SOFTWARE_FIELDS`), each set
where the framework's code or its maintainers' recipes fix it and cited below, the rest left at par3d's defaults.
An explicit flag always wins over the bundle.  Pure: no torch, no I/O.

Each value is a fact read for the validation rows of that framework (their notes in validation.toml cite the code);
none was chosen by scoring.  `python -m par3d.plan.validation --software` prints what naming the framework alone
buys on the published runs (`framework_of` in validation.py says which runs count as which framework).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Framework:
    name: str
    summary: str  # one line for --help
    facts: dict[str, Any] = field(default_factory=dict)  # Cluster field -> value, as its recipes run
    bf16_facts: dict[str, Any] = field(default_factory=dict)  # set only when training in bf16
    fp8_facts: dict[str, Any] = field(default_factory=dict)  # set only with --dtype fp8 / nvfp4
    megatron_split: bool = False  # Megatron-Core's default pipeline split (stage_layout.megatron_split) and MoE host floor
    schedules: tuple[str, ...] | None = None  # the pipeline schedules it has (None: every one the planner knows)
    sequence_parallel: bool = True  # whether it has Megatron's sequence parallelism (False: the search keeps it off)
    source: str = ""

    def resolve(self, dtype: str, sequence_parallel: bool = False, fsdp: bool = False) -> dict[str, Any]:
        """The Cluster fields this framework sets for a run in `dtype` (bf16, fp16, fp8, nvfp4, fp32).  A fact that
        cannot hold beside a choice the user fixed gives way: DeepSpeed's partitioned boundaries beside sequence
        parallelism (not modelled together), its sub-module ZeRO-3 gathers beside PyTorch FSDP (whole layers)."""
        out = dict(self.facts)
        if dtype == "bf16":
            out.update(self.bf16_facts)
        if dtype in ("fp8", "nvfp4"):
            out.update(self.fp8_facts)
        if sequence_parallel:
            out.pop("p2p_partitioned", None)
        if fsdp:
            out.pop("zero3_unit", None)
        return out


FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (
    Framework(
        "par3d", "par3d's own runtime (the defaults): pipeline sends posted, DP gradients reduced in the training "
        "dtype behind the backward, ZeRO's gathers behind compute, PyTorch's unfused cross-entropy, FlashAttention",
        source="par3d's runtime (src/par3d/pipeline, data_parallel.py, zero.py)"),
    Framework(
        "megatron-lm", "Megatron-LM on Megatron-Core (2023 on), as its performance scripts run it: blocking sends in "
        "non-interleaved 1F1B, Megatron-Core's pipeline split, fp32 gradient reduction in bf16, overlapped DP "
        "reduction and parameter gather, TP communication overlapped (with sequence parallelism), the vocab-parallel "
        "(unfused) loss",
        facts={"p2p_blocking": "1f1b", "overlap_grad_reduce": True, "overlap_param_gather": True,
               "tp_comm_overlap": True, "cross_entropy": "unfused", "cuda_graphs": "none"},
        bf16_facts={"grad_reduce_fp32": True},
        megatron_split=True, schedules=("1f1b", "interleaved"),
        source="Megatron-LM arguments.py (bf16 sets accumulate_allreduce_grads_in_fp32), "
               "core/pipeline_parallel/schedules.py (non-interleaved 1F1B waits on each send), "
               "core/transformer/transformer_block.py's default split; the r0.8 GPT scaling table's "
               "--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap (docs/planner.md §5, §6, §7)"),
    Framework(
        "megatron-lm-2021", "Megatron-LM v2-v3 (2021-22; NeMo 1.x on Apex alike): no FlashAttention, every pipeline "
        "send blocking, DP gradients all-reduced after the backward, weights gathered after the step, fp32 gradient "
        "reduction in bf16, the unfused loss",
        facts={"flash_attention": False, "p2p_blocking": "all", "overlap_grad_reduce": False,
               "overlap_param_gather": False, "cross_entropy": "unfused", "cuda_graphs": "none"},
        bf16_facts={"grad_reduce_fp32": True},
        megatron_split=True, schedules=("1f1b", "interleaved"),
        source="Megatron-LM's sc21 scripts (examples/sc21, de7dc40f88) and its 2021-22 schedules.py "
               "(p2p_communication waits on each call); NeMo 1.10-1.11's Apex pipeline without async_comm "
               "(docs/planner.md §5; issue 12's forty-third and forty-ninth rounds)"),
    Framework(
        "nemo", "NeMo 2 and Megatron-Bridge as NVIDIA's performance recipes run them (dgxc-benchmarking, MLPerf's "
        "NeMo configs): Megatron-Core's split and 1F1B sends, overlapped DP reduction and gather, TP communication "
        "overlapped (userbuffers), Transformer Engine's fused loss, FP8 weight gathers under FP8",
        facts={"p2p_blocking": "1f1b", "overlap_grad_reduce": True, "overlap_param_gather": True,
               "tp_comm_overlap": True, "cross_entropy": "kernel", "cuda_graphs": "none"},
        fp8_facts={"fp8_param_gather": True},
        megatron_split=True, schedules=("1f1b", "interleaved"),
        source="Megatron-Bridge's performance recipes (cross_entropy_fusion_impl te, tp_comm_overlap on TP > 1, "
               "fp8_param_gather in its FP8 presets, overlap_grad_reduce / overlap_param_gather) and NeMo 2's "
               "(docs/planner.md §4-§6; issue 12's fifth, sixth and forty-seventh rounds)"),
    Framework(
        "deepspeed", "DeepSpeed as Megatron-DeepSpeed's published runs ran it (BLOOM, MT-NLG, GPT-NeoX; ZeRO-3 "
        "baselines): no FlashAttention, every pipeline send blocking, boundary tensors partitioned over TP, DP "
        "gradients reduced after the backward and weights gathered after the step, ZeRO-3's gathers by sub-module, "
        "the unfused loss",
        facts={"flash_attention": False, "p2p_blocking": "all", "p2p_partitioned": True,
               "overlap_grad_reduce": False, "overlap_param_gather": False, "cross_entropy": "unfused",
               "zero3_unit": "submodule"},
        schedules=("1f1b",), sequence_parallel=False,
        source="deepspeed/runtime/pipe/engine.py (blocking p2p, is_pipe_partitioned = is_model_parallel, "
               "_exec_reduce_grads after the last backward), ZeRO-1's step, ZeRO-3's sub-module fetch "
               "(runtime/zero/partitioned_param_coordinator.py) (docs/planner.md §5; issue 12's forty-third and "
               "fifty-second rounds)"),
    Framework(
        "torchtitan", "torchtitan and trainers built like it (OLMo-core): FSDP2's fully_shard, gradients "
        "reduced in fp32 (MixedPrecisionPolicy reduce_dtype), FlashAttention-2 through SDPA, the unfused loss",
        facts={"fsdp_version": 2, "grad_reduce_fp32": True, "cross_entropy": "unfused", "attention_kernel": "fa2"},
        source="torchtitan's parallelize (fully_shard, mixed_precision_reduce float32), PyTorch SDPA's flash "
               "backend (docs/planner.md §6; issue 12's thirty-seventh round)"),
    Framework(
        "llm-foundry", "MosaicML llm-foundry on PyTorch FSDP (FlatParameter): FlashAttention-2, flash-attn's fused "
        "cross-entropy",
        facts={"fsdp_version": 1, "cross_entropy": "kernel", "attention_kernel": "fa2"},
        source="llm-foundry's benchmark yamls (attn_impl flash, loss_fn fused_crossentropy) (docs/planner.md §6; "
               "issue 12's fifteenth and seventeenth rounds)"),
    Framework(
        "maxtext", "MaxText / Paxml on JAX and XLA: fused attention, gradients reduced in fp32, collectives "
        "overlapped by XLA's scheduler, the unfused loss",
        facts={"grad_reduce_fp32": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
               "cross_entropy": "unfused"},
        source="MaxText's and JAX-Toolbox's configs as the validation rows read them (docs/planner.md §9)"),
)}


def get_framework(name: str) -> Framework:
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise ValueError(f"framework {name!r}: choose one of {', '.join(FRAMEWORKS)}") from None
