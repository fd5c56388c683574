"""Memory per GPU: model states + activations + an allowance for buffers.  All results in bytes.

Model states (mixed-precision Adam; Rajbhandari et al. 2020 "ZeRO", §3.1; seed "常见陷阱" and Q3):
    weights 2 B/param (bf16) + gradients 2 B/param + optimizer 12 B/param (fp32 master, m, v)
    = 16 B/param — the seed's count (Megatron keeps fp32 main gradients, 4 B; we follow the seed).
    fp32 training: weights 4 + gradients 4 + optimizer 8 (m, v; no separate master copy).
    fp16 is counted as bf16 (loss scaling adds a scalar).  fp8 (Transformer Engine style: fp8 GEMM
    inputs, bf16 weights and activations between kernels, fp32 master and moments) as bf16 for the
    states (for weights see "fp8 weights" below); its activations as TE saves them ("fp8 activations").
`accounting="megatron"` counts states as Megatron-LM allocates them (its distributed-optimizer
documentation's table): bf16 weights 2 B + fp32 main gradients 4 B (the gradient buffer that
accumulates across micro-batches and is reduced) + fp32 master, m, v 12 B = 18 B/param; its
distributed optimizer (our ZeRO-1) shards the 12 B: 6 + 12/d.  fp32: 4 + 4 + 8.
`optimizer_dtype="bf16"`: Adam's state kept in bf16 -- Apex's DistributedFusedAdam (the distributed
optimizer of NeMo 1.0's `optim.name: distributed_fused_adam`) allocates, per parameter of its shard,
a parameter copy (`store_params`, default on), exp_avg and exp_avg_sq, all three in its `dtype`
(apex/contrib/optimizers/distributed_fused_adam.py, StateBucket); NVIDIA's Nemotron-4 340B recipe sets
`optim.dtype: bf16` (NVIDIA/dgxc-benchmarking nemotron/nemotron4-340b-synth.yaml): 3 x 2 = 6 B, not 12.
Megatron-Core's precision-aware optimizer (`--use-precision-aware-optimizer`, Transformer Engine's FusedAdam; issue
12's thirty-second round) sets the master copy and the moments apart (megatron/core/optimizer/optimizer_config.py):
`optimizer_dtype="bf16-moments"` = fp32 master 4 + bf16 m, v 2 + 2 = 8 B (`--exp-avg-dtype bf16
--exp-avg-sq-dtype bf16`, as Megatron-Bridge's DeepSeek-V3 recipes set them); `"remainders"` = 2 + 4 + 4 = 10 B and
`"remainders-bf16-moments"` = 2 + 2 + 2 = 6 B where TE keeps only the 16 low bits of each fp32 master weight beside
the bf16 one (`store_param_remainders`, Megatron-Core's default since core 0.13 with TE >= 2.1; it applies when TE
holds the master copy: BF16 training or FP8 with delayed scaling -- with other FP8 recipes Megatron-Core holds an
fp32 master, 4 B).  The optimizer step's HBM traffic (dp_tail.py) is priced with fp32 states whatever this says.
fp8 weights: with Transformer Engine's fp8 primary weights (NeMo `fp8_params`, TE `fp8_model_init`) a
GEMM weight is 1 B plus its cached 1 B transpose (Hopper's fp8 GEMMs take only TN), i.e. bf16's 2 B;
without them TE also caches an fp8 copy and transpose of every GEMM weight beside the bf16 one
(`weight_fp8`, `weight_t_fp8` workspaces kept across micro-batches), 2 B more per GEMM parameter,
which is not counted here (the fp8 rows' recipes are taken to use fp8 primary weights).
ZeRO over the group of size d that holds the same weights (DP × CP: context-parallel ranks hold the
same weights and reduce their gradients together, as Megatron's distributed optimizer does): stage 1
shards the optimizer state (12/d), stage 2 also the gradients (2/d), stage 3 also the weights (2/d).

Activations per layer per micro-batch in bytes (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", §4, Table 2; 16-bit activations, dropout present):
    no parallelism:              s·b·h·(34 + 5·a·s/h)
    tensor parallel t:           s·b·h·(10 + 24/t + 5·a·s/(h·t))
    + sequence parallel:         s·b·h·(34/t + 5·a·s/(h·t))
    selective recompute:         drops the 5·a·s²·b/t attention-score term
    full recompute:              2·s·b·h per layer (the layer input; /t with SP) plus, once, the
                                 full activations of the one layer being back-propagated.
Context parallelism cp (ring attention, Liu et al. 2023; Megatron-LM's CP): each rank holds s/cp
tokens, so every term is computed with s/cp; attention runs blockwise (FlashAttention kernels, Dao
et al. 2022), so no s² scores are stored, only the fp32 log-sum-exp per query (4 B per head·token).
The same holds without CP when `flash=True` (FlashAttention).  GQA with tp > kv_heads stores one
replicated K/V head per rank (models.ModelSpec.kv_dim_per_rank).
The 34 splits as 10 replicated under TP (layer-norm inputs 4, QKV and MLP inputs 2+2, two dropout
masks 1+1) and 24 sharded (Q, K, V, projection input 8, MLP 16 = 4·s·b·f for f = 4h).  We keep the
split but use the real f, GQA's narrower K/V, and 8·s·b·f for a gated MLP (gate, up, act, product).
fp8 activations (Transformer Engine: transformer_engine/pytorch/module/{linear,layernorm_linear,
layernorm_mlp}.py save a GEMM's input for its weight gradient as the fp8 cast the forward GEMM used,
1 B an element): the QKV and fc1 inputs (the layer-norm outputs, 2+2 → 1+1 replicated) and the fc2
input (the activation's output, 2·s·b·f → 1·s·b·f) halve; the projection's input is saved twice, the
attention kernel's bf16 output for its own backward and the projection's fp8 cast (+1·s·b·h sharded);
the layer-norm inputs, Q/K/V, the fc1 output and the full-recompute checkpoints stay bf16.
× the schedule's peak in-flight micro-batches on the rank (from the schedule checker: GPipe m,
1F1B min(p − rank, m), ...); under ZB-H1's split backward a chunk past its BI holds its weight GEMMs' x and dy
(`weight_grad_bytes`) and on the head the output layer's input and the logits' gradient (`head_grad_bytes`)
instead, each rank's peak the largest of its walked states (stage_layout.split_states; ZB-V's head chunk:
`v_head_share`, `v_rank_units`).  The last stage also holds the logits of one micro-batch for the
loss, per token per vocab entry, /t with vocab-parallel CE, as the loss's implementation holds them
(`LOGIT_MEMORY`, `Cluster.cross_entropy`, compute.LOSS_BYTES): 6 B where an fp32 copy is made (2 B bf16 logits +
4 B fp32 softmax: Megatron-Core's unfused and native-fused cross entropy, PyTorch's F.cross_entropy on fp32
logits), 2 B where one fused kernel keeps the bf16 logits and writes the gradient into them (Transformer Engine's
parallel cross entropy; flash-attn's CrossEntropyLoss keeps the logits and a per-row log-sum-exp); the whole
vocabulary's, 6 B, not /t, where the logits are gathered to every TP rank ("gathered").

"other" = a documented allowance for what the formulas above do not count:
    1 GiB fixed (CUDA context ~0.5 GiB, cuBLAS workspaces, NCCL buffers)
    + 10% of the activations (allocator fragmentation; PyTorch's caching allocator)
    + ZeRO-3: the gathered bf16 weights of two layers (the one computing and the one prefetched);
      with DeepSpeed's sub-module units (`zero3_live`, plan_memory.zero3_live_params) the two largest
      consecutive sub-modules' weights and one sub-module's full gradient before its reduce-scatter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from .compute import layer_gemms, recompute_modules
from .hardware import OPTIMIZERS, GiB
from .models import ModelSpec

OTHER_FIXED = 1.0 * GiB
FRAGMENTATION = 0.10
ACCOUNTINGS = ("seed", "megatron")
# bytes of Adam's state per parameter (master copy, m, v) by the optimizer's state dtype (see above)
OPTIMIZER_BYTES = {"fp32": 12.0, "bf16": 6.0, "bf16-moments": 8.0, "remainders": 10.0, "remainders-bf16-moments": 6.0}
# Muon (`Cluster.optimizer` "muon"; Megatron-Core's Muon with fp32 main parameters): per weight-matrix parameter an fp32
# master copy and one fp32 momentum, 4 + 4 B -- against Adam's master, m and v; fp32 training keeps the momentum alone.
# The embedding and output layer stay on Adam (Muon's scalar optimizer: `RankShape.vocab_params`).
MUON_BYTES = 8.0
# bytes of an activation element between kernels: fp8 training keeps bf16 activations (Transformer
# Engine casts GEMM inputs to fp8 inside the GEMM's wrapper; what it saves for the backward in fp8 is
# counted in layer_activation_bytes)
ACT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2, "nvfp4": 2}
# bytes of a GEMM input Transformer Engine saves for the weight gradient as its quantized copy: fp8's cast, or NVFP4's
# (the column-wise, Hadamard-transformed E2M1 copy and its E4M3 scale per 16 elements)
SAVED_CAST_BYTES = {"fp8": 1.0, "nvfp4": 0.5 + 1 / 16}


@dataclass(frozen=True)
class MemoryBreakdown:
    weights: float
    grads: float
    optimizer: float
    activations: float
    other: float

    @property
    def states(self) -> float:
        return self.weights + self.grads + self.optimizer

    @property
    def total(self) -> float:
        return self.states + self.activations + self.other

    def gib(self) -> dict[str, float]:
        return {k: round(v / GiB, 3) for k, v in (
            ("weights", self.weights), ("grads", self.grads), ("optimizer", self.optimizer),
            ("activations", self.activations), ("other", self.other), ("total", self.total))}


def state_bytes_per_param(dtype: str, zero: int, dp: int, accounting: str = "seed",
                          optimizer_dtype: str = "fp32", optimizer: str = "adam") -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes per parameter held by this rank's model shard; `dp` is the
    size of the group ZeRO shards over (dp × cp); `optimizer_dtype` the dtype of Adam's state
    (16-bit training only); `optimizer` "muon" a weight matrix's Muon state (MUON_BYTES), which the
    layer-wise distributed optimizer shards over dp × cp as ZeRO-1 does."""
    if optimizer_dtype not in OPTIMIZER_BYTES:
        raise ValueError(f"optimizer_dtype {optimizer_dtype!r}: choose one of {sorted(OPTIMIZER_BYTES)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer {optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
    if optimizer == "muon" and optimizer_dtype != "fp32":
        raise ValueError(f"optimizer_dtype {optimizer_dtype!r} with Muon: the state dtypes set Adam's moments; Muon "
                         "keeps an fp32 momentum (drop the optimizer dtype)")
    if dtype == "fp32":
        w, g, o = 4.0, 4.0, (4.0 if optimizer == "muon" else 8.0)
    else:
        # Megatron's fp32 main gradients; DeepSpeed's BF16_Optimizer's full fp32 buffer beside the bf16 .grad it adds
        # each micro-batch's gradients from (bf16_optimizer.py's fp32_groups_gradients_flat: "not sharded")
        w, g = 2.0, {"megatron": 4.0, "bf16_optimizer": 6.0}.get(accounting, 2.0)
        o = MUON_BYTES if optimizer == "muon" else OPTIMIZER_BYTES[optimizer_dtype]
    if zero >= 1:
        o /= dp
    if zero >= 2:
        g /= dp
    if zero >= 3:
        w /= dp
    return w, g, o


@lru_cache(maxsize=4096)
def layer_activation_bytes(model: ModelSpec, b: int, tp: int, sp: bool, recompute: str,
                           dtype: str = "bf16", cp: int = 1, flash: bool = False, etp: int = 1) -> float:
    """Stored activations of one layer for one micro-batch on one TP rank (Korthikanti 2022), with
    s/cp tokens per rank under context parallelism.  Expert tensor parallelism (`etp`, choice.Choice.etp) gathers
    etp times the routed copies onto each rank at 1/etp of the expert's width: the copies' fc1 inputs (h wide)
    are etp times as many; their width-wide activations as without it."""
    s_full, h, a, t = model.seq_len, model.hidden, model.heads, tp
    s = s_full / cp  # this rank's tokens
    scale = ACT_BYTES[dtype] / 2.0  # the formulas assume 2-byte activations
    sbh = s * b * h
    if recompute == "full":
        return scale * 2.0 * sbh / (t if sp else 1)
    if recompute == "op":  # torchtitan's selective op: the block's input and the saved ops' outputs (compute.op_shares)
        # replicated: the input and w2's (fc2's) output; sharded: wq's and the attention's outputs, wv's, w1's (fc1's)
        lse = 4.0 * a * s * b / scale  # the attention kernel's fp32 log-sum-exp, saved with its output
        kv = s * b * model.kv_dim_per_rank(t) * t
        width = model.routed_copies * model.expert_ffn + model.shared_ffn if model.moe else model.ffn  # fc1 outputs per token
        return scale * (4.0 * sbh / (t if sp else 1) + (4.0 * s * b * model.q_dim + 2.0 * kv
                                                         + 2.0 * s * b * width + lse) / t)
    # LayerNorm inputs 4, attention and MLP inputs 2 + 2, the two dropout masks 1 + 1 (models without
    # biases -- Llama-style -- train without dropout, as compute.elementwise_bytes prices them)
    replicated = (10.0 if model.bias else 8.0) * sbh
    # GeLU: fc1 output 2 + GeLU output 2 units of s·b·f; SwiGLU: fc1's 2f-wide output 4 + fc2's input 2
    # (Megatron-Core's fused bias-SwiGLU saves only its input, megatron/core/fusions/fused_bias_swiglu.py)
    unit = 6.0 if model.gated else 4.0
    if model.moe:  # per routed copy (k per token, on this rank's s·b/t tokens): the expert's activation units at
        # its width, its permuted input (2 per h: fc1's input) and its output before the weighted combine (2 per h);
        # the router's fp32 probabilities (4 per expert); a shared expert as a dense MLP of its width
        k = model.routed_copies  # (the busiest expert-parallel rank's)
        mlp = s * b * (k * (unit * model.expert_ffn + 2.0 * h * etp + 2.0 * h) + 4.0 * model.experts
                       + unit * model.shared_ffn)
    else:
        mlp = unit * s * b * model.ffn
    # Q, projection input (4 units of s·b·q/t, q = heads · head_dim: h unless the heads have their own
    # width), K and V at this rank's K/V width (replicated when tp > kv)
    sbq = s * b * model.q_dim
    # (MLA: Q at heads x its Q/K head width, the projection input at V's; the latents, whole on each TP rank (on its
    # sequence shard under SP), 2 units each, in `latents`)
    sharded = 2.0 * sbq + 2.0 * s * b * model.o_dim + 4.0 * s * b * model.kv_dim_per_rank(t) * t + mlp
    latents = 2.0 * s * b * (model.q_lora + model.kv_lora + model.rope_dim) / (t if sp else 1)  # SP: each rank's shard
    # Q's and K's norms (models.ModelSpec.qk_norm) keep their inputs, views of the QKV projection's output, which V's view
    # of the same buffer holds for the attention anyway; counted as new memory they would put 22 of Megatron-Bridge's
    # Qwen3 runs, which ran, over their GPUs (issue 12's thirty-fifth round): not counted
    q = SAVED_CAST_BYTES.get(dtype, 2.0)  # bytes of a saved GEMM input (2: bf16, as the formulas count it)
    if dtype in SAVED_CAST_BYTES:  # TE saves the GEMMs' inputs as their fp8 (or NVFP4) casts (module docstring,
        # "fp8 activations"); `dtype` "nvfp4": `Cluster.precision`
        replicated -= 2.0 * (2.0 - q) * sbh  # QKV and fc1 inputs: 2 + 2 -> q + q
        # projection input once more as a cast; fc2 input 2 -> q (MoE: each routed copy's fc1 and fc2 inputs)
        fc2_in = (s * b * (model.routed_copies * (model.expert_ffn + h * etp) + model.shared_ffn) if model.moe
                  else s * b * model.ffn)
        sharded += q * s * b * model.o_dim - (2.0 - q) * fc2_in
    mods = recompute_modules(recompute)
    if recompute.startswith("selective:"):
        # Megatron-Core's named modules (compute.RECOMPUTE_MODULES) keep their input and drop what they store inside
        # (the module docstring's split): each as saved above (fp8 GEMM inputs as casts)
        unit = 6.0 if model.gated else 4.0
        fc1_out = unit - 2.0  # per MLP-width element: a gated MLP's 2f-wide fc1 output (4 units), GeLU's input (2)
        if "mla_up_proj" in mods and model.mla:  # Q, K and V, the up projections' outputs
            sharded -= 2.0 * sbq + 4.0 * s * b * model.kv_dim_per_rank(t) * t
        if "layernorm" in mods and dtype not in SAVED_CAST_BYTES:  # the norms' outputs, the QKV and MLP inputs (2 + 2);
            # under fp8 the GEMMs keep their own quantized copies, which the norms' recomputation does not free
            replicated -= 4.0 * sbh
        if model.moe:
            k, fe, fs = model.routed_copies, model.expert_ffn, model.shared_ffn
            routed = s * b * k * (fc1_out * fe + q * fe + q * h * etp + 2.0 * h) + 4.0 * s * b * model.experts
            shared = s * b * (fc1_out + q) * fs
            if "moe" in mods:  # the whole block: routed copies, router probabilities, shared experts
                sharded -= routed + shared
            else:
                if "moe_act" in mods:  # the routed experts' activation output (fc2's input)
                    sharded -= q * s * b * k * fe
                if "shared_experts" in mods:
                    sharded -= shared
        elif "mlp" in mods:  # the dense MLP's fc1 output and activation (its input, the norm's output, kept)
            sharded -= (fc1_out + q) * s * b * model.ffn
    if "core_attn" in mods:
        scores = 0.0
    elif flash or cp > 1:  # blockwise attention: fp32 log-sum-exp per head and query, no s² scores
        scores = 4.0 * a * s * b / scale
    else:
        scores = 5.0 * a * s * s * b
    return scale * (replicated / (t if sp else 1) + (sharded + scores) / t + latents)


@lru_cache(maxsize=4096)
def weight_grad_share(model: ModelSpec, b: int, tp: int, sp: bool, recompute: str, dtype: str = "bf16", cp: int = 1,
                      flash: bool = False, etp: int = 1, ep: int = 1, saved: float | None = None) -> float:
    """The share of one layer's stored activations (`layer_activation_bytes`, or `saved` where given: block
    recomputation's mean over a chunk, plan_memory.stored_layer_bytes) a split backward keeps from its input
    half (BI) to its weight half (BW), at most 1: each weight GEMM's input x and output gradient dy
    (dW = dyᵀ·x), what `par3d.weight_grad` and the Zero Bubble authors' WeightGradStore keep once BI has freed the
    graph.  For a GPT layer at TP 1 that is 14h (the four linears' inputs) + 18h (their output gradients) = 32h bytes
    a token, the authors' own estimate (w_mem = -32h against f_mem = 34h + 5as, sail-sg/zero-bubble-pipeline-
    parallelism, megatron/core/pipeline_parallel/schedules.py): without FlashAttention BI frees the s² scores and
    ~57 % of the layer at s = 1,024; with it, little (a share near 0.94).  Where BI holds more than F saved -- full
    recomputation (the recomputed forward's inputs), sequence parallelism at TP 8, op recomputation -- 1: the V's cap
    counts such a chunk whole until BW, and the planner's memory counts the bytes above it (ZB-H1 and DualPipe-V by
    their ranks' states, ZB-V by the factor `plan_memory._zbv_kept_factor`: docs/planner.md §6)."""
    if saved is None:
        saved = layer_activation_bytes(model.at_ep(ep), b, tp, sp, recompute, dtype, cp, flash, etp)
    if saved <= 0:
        return 1.0
    return min(1.0, weight_grad_bytes(model, b, tp, sp, dtype, cp, etp, ep) / saved)


def weight_grad_bytes(model: ModelSpec, b: int, tp: int, sp: bool, dtype: str = "bf16", cp: int = 1, etp: int = 1,
                      ep: int = 1) -> float:
    """The bytes one layer keeps from its split backward's input half (BI) to its weight half (BW): each weight
    GEMM's input x and output gradient dy, whatever the forward saved (`weight_grad_share`'s numerator, not capped:
    under full recomputation BI's recomputed forward leaves these behind, many times the layer's saved input)."""
    model = model.at_ep(ep)  # as plan_memory prices the layer (balanced routing without EP), and as layer_gemms does
    xb = SAVED_CAST_BYTES.get(dtype, float(ACT_BYTES[dtype]))  # a saved GEMM input (fp8: its cast)
    db = float(ACT_BYTES[dtype])  # an output gradient
    # (sequence parallelism: a deferred weight GEMM keeps the whole sequence's input, the all-gathered x its forward
    # ran on -- `par3d.weight_grad` holds the gathered tensor, as Megatron-style stores hold `total_input` -- and its
    # row-parallel dy whole too, where the forward saved sequence shards: the share passes 1 at TP 8, and counts 1)
    return sum(g.batch * g.m * (g.k * xb + g.n * db) for g in layer_gemms(model, b, tp, ep, sp, etp)
               if g.name not in ("attn_scores", "attn_values")) / cp  # this CP rank's s/cp tokens


def head_grad_bytes(model: ModelSpec, b: int, tp: int, dtype: str = "bf16", cp: int = 1) -> float:
    """What the output layer keeps from its BI to its BW: its input (b·s/cp tokens of h) and the logits' gradient
    (b·s/cp tokens of V/tp), the output layer's (x, dy) as `par3d.weight_grad` and the Zero Bubble authors'
    WeightGradStore defer every linear layer's.  The loss's own memory (`logits_bytes`) is gone by then."""
    xb = SAVED_CAST_BYTES.get(dtype, float(ACT_BYTES[dtype]))
    return b * model.seq_len / cp * (model.hidden * xb + model.vocab / tp * float(ACT_BYTES[dtype]))


def v_head_share(model: ModelSpec, b: int, tp: int, sp: bool, recompute: str, dtype: str, cp: int, flash: bool,
                 etp: int, ep: int, head_layers: int, unit_layers: float, layer: float | None = None) -> float:
    """What ZB-V's head chunk (the V's last stage, on rank 0) keeps from its BI to its BW, in forwards of a chunk of
    `unit_layers` layers: its `head_layers` layers at `weight_grad_share` and the output layer's input and logits'
    gradient (`head_grad_bytes`), which the V's memory cap counts (`schedules.zero_bubble_v`'s fifth time; issue
    12's sixty-sixth round).  Above 1 where the vocabulary is large against a chunk.  `layer`: one layer's stored
    bytes where not `layer_activation_bytes`' (block recomputation's mean over a chunk), the unit the count uses."""
    if layer is None:
        layer = layer_activation_bytes(model.at_ep(ep), b, tp, sp, recompute, dtype, cp, flash, etp)
    if layer <= 0 or unit_layers <= 0:
        return 1.0
    held = weight_grad_share(model, b, tp, sp, recompute, dtype, cp, flash, etp, ep, layer)
    return (head_layers * held * layer + head_grad_bytes(model, b, tp, dtype, cp)) / (unit_layers * layer)


def v_rank_units(p: int, m: int, held: float, share: float) -> float:
    """A ZB-V rank's peak, in chunks' forwards, where its chunks past BI keep `held` and `share` (its head chunk's,
    `v_head_share`; `held` on ranks without the head): at most min(2p, 2m) while both are at most 1 (the cap,
    `stage_layout.counted_peaks`); a head share above 1 lets one head BI pass the cap by share - 1 (its forward waited
    under the cap, and it runs right after it), and with few micro-batches every one of them may be past its BI
    (m·(held + share)).  At p = 2 one forward more: where every rank would wait (a short BW, as ZeRO-3's gathers make
    it) the builder takes a forward past its cap (`schedules.zero_bubble_v`), and on two stages that lands on rank 0
    (a review of issue 12's sixty-seventh round: 0.84 of the walk without it; a grid of p 2-5, m 1-6p, 240 time
    ratios and 5 shares found it at p = 2 only, rank 0 only, one forward at most).  Checked against the built orders'
    walks (tests/test_split_memory.py)."""
    h, k = max(1.0, held), max(1.0, share)
    return min(2 * p - 1 + k + (1.0 if p == 2 else 0.0), m * (h + k))


def round_up_2g(x: float) -> float:
    """x rounded up to two significant digits (x > 0): the share the V's cap counts (cost.zbv_times) is then at least
    the model's."""
    r = float(f"{x:.2g}")
    if r >= x:
        return r
    step = 10.0 ** (math.floor(math.log10(r)) - 1)
    return float(f"{r + step:.2g}")


# bytes per logit the loss holds between its forward and backward, by implementation (module docstring)
LOGIT_MEMORY: dict[str, float] = {"unfused": 6.0, "fused": 6.0, "kernel": 2.0, "gathered": 6.0}
# par3d's own runtime (`cross_entropy="runtime"`, predict.runtime_memory_flags; not a planner choice): its loss casts
# the logits to fp32 and keeps only that copy's softmax (tensor_parallel.py: F.cross_entropy's log-softmax at TP 1,
# the vocab-parallel loss's softmax above), 4 B whatever the dtype -- its activation meter's last stage measured so
RUNTIME_LOGIT_MEMORY = 4.0


def logits_bytes(model: ModelSpec, b: int, tp: int, cp: int = 1, cross_entropy: str = "unfused") -> float:
    per = RUNTIME_LOGIT_MEMORY if cross_entropy == "runtime" else LOGIT_MEMORY[cross_entropy]
    return per * b * model.seq_len / cp * (model.vocab if cross_entropy == "gathered" else model.vocab / tp)


@dataclass(frozen=True)
class RankShape:
    """What one pipeline rank holds: parameters of its chunks and per-chunk layer counts."""

    params: float  # parameters on this rank after TP sharding
    layers: tuple[int, ...]  # layers of each chunk on this rank
    head: bool  # holds the output head (last stage)
    expert_params: float = 0.0  # of `params`, the routed experts' (MoE): ZeRO shards their states over the
    # expert-data-parallel group (the ranks holding the same experts), not over dp × cp
    vocab_params: float = 0.0  # of `params`, the embedding's and the output layer's (Muon leaves them to Adam)
    dense_layers: int = 0  # of `layers`, a mixture of experts' dense ones (models.ModelSpec.dense_layers)


def rank_memory(model: ModelSpec, shape: RankShape, inflight: int, *, tp: int, dp: int, b: int, sp: bool,
                recompute: str, zero: int, dtype: str, v: int = 1, cp: int = 1, flash: bool = False,
                accounting: str = "seed", zero3_live: float | None = None,
                optimizer_dtype: str = "fp32", inflight_layers: float | None = None,
                per_layer: float | None = None, cross_entropy: str = "unfused",
                expert_dp: int | None = None, etp: int = 1, optimizer: str = "adam",
                split: tuple[tuple[int, int], ...] | None = None, walked: float | None = None) -> MemoryBreakdown:
    """Memory of one GPU.  `inflight` is the checker's peak count of forward passes whose backward
    has not run yet on this rank; with v chunks it counts (micro-batch, chunk) pairs, each holding
    one chunk's layers, so without `inflight_layers` (the peak of live layers counted chunk by chunk:
    stage_layout.peak_layers) we use the rank's mean layers per chunk.  A split backward in a fixed order (ZB-H1)
    gives its rank's candidate peaks instead (`split`, stage_layout.split_states); `walked`, the peak of the rank's
    own actions walked in bytes (stage_layout.walked_bytes: `par3d train`'s prediction of a V schedule), replaces the
    count (the recomputed layer's working set still added).  A mixture of experts' routed experts
    (`shape.expert_params`) shard their ZeRO states over `expert_dp` ranks (tp·cp·dp / ep).  Under Muon
    (`optimizer`) the embedding and output layer (`shape.vocab_params`) keep Adam's state."""
    states = state_terms(model, tp=tp, dp=dp, zero=zero, dtype=dtype, cp=cp, accounting=accounting,
                         zero3_live=zero3_live, optimizer_dtype=optimizer_dtype, expert_dp=expert_dp, optimizer=optimizer)
    acts = activation_terms(model, tp=tp, b=b, sp=sp, recompute=recompute, dtype=dtype, cp=cp, flash=flash,
                            cross_entropy=cross_entropy, etp=etp)
    if walked is not None:
        act = walked + (acts[1] or 0.0)
        other = OTHER_FIXED + FRAGMENTATION * act
    else:
        kept = ((weight_grad_bytes(model, b, tp, sp, dtype, cp, etp), head_grad_bytes(model, b, tp, dtype, cp))
                if split is not None else (0.0, 0.0))
        act, other = rank_activations(acts, model.mtp_layers, shape, inflight, inflight_layers, per_layer, split, *kept)
    return MemoryBreakdown(*rank_states(states, shape, act, other))


# `rank_memory` in two halves, each with what every pipeline rank of one configuration shares computed once: the
# activations (which no ZeRO stage changes) and the states.  plan_memory.memory prices several candidate ranks of each
# configuration, and every ZeRO stage of one layout, from them; the same numbers in the same sums as rank_memory's.

def activation_terms(model: ModelSpec, *, tp: int, b: int, sp: bool, recompute: str, dtype: str, cp: int = 1,
                     flash: bool = False, cross_entropy: str = "unfused", etp: int = 1) -> tuple:
    """(one layer's stored activations, what the layer being back-propagated adds live once or None, the logits)."""
    layer = layer_activation_bytes(model, b, tp, sp, recompute, dtype, cp, flash, etp)
    working = None
    if recompute == "full":  # the working set of the layer being recomputed and back-propagated
        working = layer_activation_bytes(model, b, tp, sp, "none", dtype, cp, flash, etp)
    elif recompute in ("selective", "op") or recompute.startswith("selective:"):  # what the layer being
        # back-propagated recomputes, live once
        working = max(0.0, layer_activation_bytes(model, b, tp, sp, "none", dtype, cp, flash, etp) - layer)
    return layer, working, logits_bytes(model, b, tp, cp, cross_entropy)


def rank_activations(terms: tuple, mtp_layers: int, shape: RankShape, inflight: int,
                     inflight_layers: float | None = None, per_layer: float | None = None,
                     split: tuple[tuple[int, ...], ...] | None = None, kept: float = 0.0,
                     head_kept: float = 0.0) -> tuple[float, float]:
    """One rank's (activations, other without ZeRO-3's gathered weights) from `activation_terms`.  With `split`
    (stage_layout.split_states: a one-chunk rank's (chunks before BI, chunks past BI) at its candidate peaks;
    v_layer_states: DualPipe-V's (layers before BI, layers past BI, head chunks before, head chunks past BI)) the
    chunks past their BI hold `kept` a layer (`weight_grad_bytes`) and, on the head, `head_kept` (`head_grad_bytes`)
    instead of the forward's bytes and the logits; `inflight_layers` is then unused."""
    layer, working, logits = terms
    if per_layer is None:  # given: a chunk whose layers store differently (plan_memory.partial_activation_bytes)
        per_layer = layer
    if split is not None:
        if len(split[0]) == 4:  # DualPipe-V's in layers and head chunks (stage_layout.v_layer_states); each head chunk
            # carries its multi-token-prediction modules (a layer and a pass of the output head each) as its own
            # layers: their forward's bytes before its BI, their weight GEMMs' pairs past it
            hf_bytes = logits + mtp_layers * (per_layer + logits)
            hk_bytes = head_kept + mtp_layers * (kept + head_kept)
            act = max(x * per_layer + y * kept + hf * hf_bytes + hk * hk_bytes for x, y, hf, hk in split)
        else:
            n = sum(shape.layers)
            f = n * per_layer + (logits if shape.head else 0.0)
            k = n * kept + (head_kept if shape.head else 0.0)
            act = max(a * f + b * k for a, b in split)
            if shape.head:
                act += mtp_layers * (inflight * per_layer + logits)
        if working is not None:
            act += working
        return act, OTHER_FIXED + FRAGMENTATION * act
    if inflight_layers is None:
        inflight_layers = inflight * sum(shape.layers) / max(len(shape.layers), 1)
    act = inflight_layers * per_layer
    if working is not None:
        act += working
    if shape.head:
        act += logits
        # multi-token prediction (models.ModelSpec.mtp_layers): each module's layer for every in-flight micro-batch
        # of the last stage, and its own logits
        act += mtp_layers * (inflight * per_layer + logits)
    return act, OTHER_FIXED + FRAGMENTATION * act


def state_terms(model: ModelSpec, *, tp: int, dp: int, zero: int, dtype: str, cp: int = 1, accounting: str = "seed",
                zero3_live: float | None = None, optimizer_dtype: str = "fp32", expert_dp: int | None = None,
                optimizer: str = "adam") -> tuple:
    """Bytes per parameter of the dense and the routed-expert states, ZeRO-3's gathered weights (or None) and
    Muon's Adam-kept embedding's extra optimizer bytes per parameter, for `rank_states`."""
    wb, gb, ob = state_bytes_per_param(dtype, zero, dp * cp, accounting, optimizer_dtype, optimizer)
    gathered = None  # gathered 16-bit weights: `zero3_live` parameters, else two whole layers
    if zero >= 3:
        gathered = 2.0 * (zero3_live if zero3_live is not None else 2 * model.layer_params_per_rank(tp))
    # a mixture of experts' routed experts shard over the expert-data-parallel group (read by ranks holding some)
    expert = state_bytes_per_param(dtype, zero, expert_dp or dp * cp, accounting, optimizer_dtype, optimizer) \
        if model.moe else (wb, gb, ob)
    muon = optimizer == "muon"  # the embedding / output layer on Adam: its optimizer bytes less Muon's
    adam = (state_bytes_per_param(dtype, zero, dp * cp, accounting, optimizer_dtype)[2] - ob) if muon else 0.0
    return wb, gb, ob, expert, gathered, muon, adam


def rank_states(terms: tuple, shape: RankShape, act: float, other: float) -> tuple[float, float, float, float, float]:
    """One rank's (weights, grads, optimizer, activations, other) from `state_terms` and `rank_activations`."""
    wb, gb, ob, expert, gathered, muon, adam = terms
    if gathered is not None:
        other += gathered
    dense, experts = shape.params - shape.expert_params, shape.expert_params
    we, ge, oe = (wb, gb, ob) if not experts else expert
    opt = ob * dense + oe * experts
    if muon and shape.vocab_params:
        opt += adam * shape.vocab_params
    return wb * dense + we * experts, gb * dense + ge * experts, opt, act, other
