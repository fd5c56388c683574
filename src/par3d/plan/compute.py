"""FLOPs and time of a transformer layer on one GPU.

FLOPs (forward, one micro-batch of b sequences of length s, T = b·s tokens, TP degree t):
- QKV projection 2·T·h·(q + 2·kv_dim)/t, output projection 2·T·h·q/t (q = heads · head_dim, = h
  unless the heads have a width of their own: models.ModelSpec.q_dim),
- MLP 2·T·h·f·(2 or 3)/t (3 matrices when gated),
- attention core (QKᵀ and ·V) 4·T·s·h/t  (not halved for causal masks, as Megatron counts),
so for f = 4h, MHA: 24·T·h² + 4·T·s·h = 24·T·h²·(1 + s/(6h))  (Narayanan et al. 2021, eq. 3;
the seed's §4.2 counts the GEMM part 24·B·S·H²).  Backward = 2 × forward; the output head adds
2·T·h·V/t forward.

Time of one GEMM (M×K by K×N) is a roofline (seed §4.4, Williams et al. 2009):
    t = max( FLOPs / (peak · efficiency · wave_eff),  bytes / HBM bandwidth )
with bytes = (M·K + K·N + M·N)·dtype bytes (each operand read once, output written once — the
seed's "forced DRAM traffic") and wave_eff the wave quantization of seed §3.2: the output is cut
into 128×128 tiles, one per SM at a time; ceil(tiles/SMs) waves run, the last one partly empty.
When there are fewer tiles than SMs we assume split-K (as cuBLAS does) up to K/512 ways.
In the **flat** kernel model (the seed's), `efficiency` (hardware.py) is the achievable fraction
of peak for every GEMM; it also stands in for the elementwise kernels (layer norm, GeLU, softmax,
dropout) that are not modelled one by one.

In the **table** kernel model (catalogue GPUs by default):
- a GEMM takes  max(FLOPs · d(K) / (peak · f_dtype · wave_eff), bytes / (HBM · mem_eff)) + t_gemm:
  f_dtype is the GPU's sustained achievable share of peak for large GEMMs (gemm_table.py:
  measured MAMF × sustained clock), wave_eff the same tile/wave quantization, d(K) =
  max(1, (K + K0)/K · K_ref/(K_ref + K0)) the depth curve (each output tile's fill and epilogue cost
  about K0 = 136 of its K; K_ref = 4,096 the depth at which f_dtype is reached) and t_gemm = 6 µs the
  kernel's fixed cost -- K0 and t_gemm fitted to OpenXLA's measured H100 GEMM table (gemm_shapes.py),
  not to training runs.  Achieved throughput therefore rises with size: small GEMMs are bound by HBM
  traffic, by partly empty waves and by the fixed cost, shallow ones by their tiles' fill and drain,
  large deep ones approach f_dtype.
- non-GEMM work is HBM traffic at `mem_eff` of the bandwidth (`elementwise_bytes`): two norms,
  two bias+dropout+residual blocks, the activation (GeLU or SwiGLU), rotary embeddings, and —
  without FlashAttention — the softmax and dropout over the b·a/t·s² attention scores;
  backward moves twice the forward's bytes.
- with FlashAttention (default where the GPU has it; `--no-flash-attention` turns it off) the
  attention core is one fused kernel at `attn_eff` of peak doing the causal half of the FLOPs
  the formulas above count (FlashAttention skips masked tiles), and no s² tensor is written.
- the output head adds the cross-entropy over the logits as HBM traffic per logit, counted kernel by
  kernel for the implementation that runs it (`LOSS_BYTES`, `Cluster.cross_entropy`; issue 12's
  seventeenth round: until then one 14 B count for every run, an idealised fused kernel):
  * "unfused", 52 B — Megatron-Core's `VocabParallelCrossEntropy` (its default: `cross_entropy_loss_fusion`
    off; Megatron-LM since 2019 runs the same ops): forward `.float()` (read 2, write 4), max (read 4),
    in-place subtract (4 + 4), in-place exp (4 + 4), sum (4), in-place divide (4 + 4) = 38; backward the
    in-place multiply by the loss gradient (4 + 4) and the cast back to bf16 for the output layer's
    backward GEMM (4 + 2) = 14.  PyTorch's `F.cross_entropy` on an fp32 copy (torchtitan, fms-fsdp) moves
    48 B (the copy 6, log-softmax's three reads and a write 16, NLL's zero-filled gradient 4, log-softmax
    backward 16, the cast back 6) and is priced as this class;
  * "fused", 28 B — Megatron-Core's `cross_entropy_loss_fusion` with the native (jit) implementation, the
    default of NeMo 2's GPTConfig from NeMo v2.0 (2024-09) to v2.3, and what NeMo 1.0 runs where its model config
    sets the key on Megatron-Core >= 0.8 (issue 12's forty-seventh round): one kernel per fused function: `.float()`
    and max (2 + 4), subtract-exp-sum (4 + 4), divide (4 + 4), the gradient's multiply and bf16 cast (4 + 2);
  * "kernel", 10 B — one online-softmax kernel pair on the bf16 logits that writes the gradient in the
    forward: Transformer Engine's parallel cross entropy (`cross_entropy_fusion_impl = "te"`, which
    Megatron-Bridge's and NeMo's performance scripts set, NeMo's since v2.3): a max/sum pass (read 2), a loss-and-gradient
    pass (2 + 2), the backward's scaling (2 + 2); flash-attn's CrossEntropyLoss (llm-foundry's default
    `fused_crossentropy`) moves 6 B and is priced as this class;
  * "gathered", 52 B over the whole vocabulary — the output layer's vocabulary shards all-gathered to every TP rank
    before an unfused loss, which each TP rank then runs on all V entries (Aleph Alpha's scaling: its LM head is a
    ColumnParallelLinear without `parallel_output`, whose forward concatenates the shards; issue 12's fifty-first
    round); the gather is priced with the head's TP collectives (cost.stage_times).  At TP 1 it is "unfused".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from .eager import block_bytes
from .gemm_table import NVFP4_CAST_OVER_MXFP8
from .hardware import Device, layer_gemm_dtype
from .models import ModelSpec

TILE = 128  # CTA output tile edge for bf16 tensor-core GEMMs (CUTLASS/cuBLAS default class)
SPLIT_K_MIN = 512  # smallest K slice per split-K CTA
KERNEL_S = 3e-6  # fill and drain of one fused attention kernel (table model): a few µs, an assumption
# A GEMM's depth and fixed cost (table model; issue 12's nineteenth round), FITTED to a GEMM benchmark and not to
# any training run: OpenXLA's measured H100 matmul table (gemm_shapes.py: 90 GEMMs of the training regime; fit
# reproduced by `python -m par3d.plan.gemm_shapes --fit`, scored on the same table's B200 entries, held out).
# A GEMM of depth K runs its main loop at K / (K + GEMM_K0) of the rate it would reach at infinite depth -- each
# output tile's pipeline fill and epilogue cost about GEMM_K0 of K -- and each kernel costs GEMM_FIXED_S more.
GEMM_K0 = 136
GEMM_FIXED_S = 6e-6
# GEMM_K0 is BF16's.  The overhead it stands for is time, not depth: the epilogue writes the same 16-bit output
# whatever the inputs' dtype, and the fill is latency.  A dtype whose main loop runs r x BF16's (the model's own
# large-GEMM rates: FP8 1.68 on the H100, 1.85 on the B200; MXFP8 1.75, NVFP4 3.42) spends the same seconds on it, i.e. r x K0 of its depth
# (`depth_k0`; issue 12's thirty-second round).  Derived, not fitted; scored on the held-out FP8 GEMM sets
# (gemm_shapes.py, mean |error|: B200 OpenXLA 15.6 -> 10.8 %, the H200 measured here 19.8 -> 15.3 %; the H100
# FP8 column, above its peak and so scored only as a shape, 5.8 -> 6.4 %).
# The depth at which a GPU's large-GEMM rate (MAMF x sustained x step share, gemm_table.py) is reached: the
# deepest GEMMs of the fitted table (K = 4,096), where it peaks.  Shallower GEMMs run slower by the curve; deeper
# ones are not extrapolated faster than that rate (no measurement beyond K = 4,096 in the table).
GEMM_K_REF = 4096
# HBM bytes per logit that the loss moves, forward + backward, per implementation (see the module docstring)
LOSS_BYTES: dict[str, float] = {"unfused": 52.0, "fused": 28.0, "kernel": 10.0, "gathered": 52.0}
CROSS_ENTROPY = tuple(LOSS_BYTES)


def loss_vocab(vocab: int, tp: int, cross_entropy: str = "unfused") -> int:
    """The vocabulary entries of each logit row one TP rank's loss runs over: its shard, ⌈V/tp⌉, for a vocab-parallel
    cross entropy; all V where the logits are gathered to every TP rank first ("gathered")."""
    return vocab if cross_entropy == "gathered" else -(-vocab // tp)

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "mxfp8": 1, "nvfp4": 0.5 + 1 / 16}  # NVFP4: E2M1 + E4M3/16
# the dtype the fused attention kernel runs in: fp8 training (Transformer Engine, as NeMo/Megatron-Bridge
# run it) keeps attention in bf16 unless fp8 dot-product attention is asked for (fp8_dpa, off by default)
ATTN_DTYPE = {"fp8": "bf16"}


def act_bytes(dtype: str) -> float:
    """Bytes of an activation between kernels: fp8 training (Transformer Engine) keeps them 16-bit, only GEMM inputs
    are cast; other dtypes their own width."""
    return 2 if dtype == "fp8" else DTYPE_BYTES.get(dtype, 2)


@dataclass(frozen=True)
class Gemm:
    name: str
    m: int
    n: int
    k: int
    batch: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    def bytes(self, dtype_bytes: int) -> float:
        return float(dtype_bytes) * self.batch * (self.m * self.k + self.k * self.n + self.m * self.n)


@dataclass(frozen=True)
class Roofline:
    flops: float
    bytes: float
    intensity: float  # FLOP/byte
    balance: float  # device ridge point, FLOP/byte
    bound: str  # "memory" or "compute"
    attainable: float  # FLOP/s = min(peak, intensity · bandwidth)
    fraction_of_peak: float
    wave_eff: float
    time: float  # seconds, with efficiency and wave quantization


def wave_efficiency(g: Gemm, sms: int) -> float:
    """Useful share of the SM-slots that the waves occupy (seed §3.2: 512 blocks on 216 slots
    → 3 waves, the last 40% full)."""
    tiles = -(-g.m // TILE) * -(-g.n // TILE) * g.batch
    if tiles < sms:  # split-K fills idle SMs
        tiles *= max(1, min(sms // tiles, g.k // SPLIT_K_MIN))
    waves = -(-tiles // sms)
    return tiles / (waves * sms)


def gemm_depth(k: int, k0: float = GEMM_K0) -> float:
    """The depth curve: a GEMM of depth k against one at K_ref, no credit beyond it (see GEMM_K0)."""
    return max(1.0, (k + k0) / k * GEMM_K_REF / (GEMM_K_REF + k0))


def depth_k0(dev: Device, dtype: str) -> float:
    """GEMM_K0 for `dtype` on `dev`: BF16's, times the dtype's large-GEMM rate over BF16's where that is faster
    (see GEMM_K0: the per-tile overhead is fixed in seconds, so a faster main loop covers more depth in it)."""
    if "bf16" not in dev.peak_flops or dtype not in dev.peak_flops:
        return GEMM_K0
    r = dev.peak(dtype) * dev.gemm_fraction(dtype) / (dev.peak("bf16") * dev.gemm_fraction("bf16"))
    return GEMM_K0 * max(1.0, r)


def table_gemm_seconds(g: Gemm, rate: float, sms: int, hbm: float, dtype_bytes: int, k0: float = GEMM_K0,
                       fixed_s: float = GEMM_FIXED_S) -> float:
    """One GEMM in the table model: its FLOPs at `rate` FLOP/s (the large-GEMM rate, reached at K_ref) through
    the waves and the depth curve, or its bytes at `hbm` bytes/s if slower, plus the kernel's fixed cost.
    gemm_shapes.py fits `k0` and `fixed_s` with this same function."""
    return max(g.flops * gemm_depth(g.k, k0) / (rate * wave_efficiency(g, sms)),
               g.bytes(dtype_bytes) / hbm) + fixed_s


def roofline(g: Gemm, dev: Device, dtype: str) -> Roofline:
    peak = dev.peak(dtype)
    nbytes = g.bytes(DTYPE_BYTES[dtype])
    ai = g.flops / nbytes
    attainable = min(peak, ai * dev.mem_bw)
    we = wave_efficiency(g, dev.sms)
    if dev.kernel_model == "table":
        t = table_gemm_seconds(g, peak * dev.gemm_fraction(dtype), dev.sms, dev.mem_bw * dev.mem_eff,
                               DTYPE_BYTES[dtype], depth_k0(dev, dtype))
    else:
        t = max(g.flops / (peak * dev.efficiency * we), nbytes / dev.mem_bw)
    return Roofline(g.flops, nbytes, ai, dev.balance(dtype), "memory" if ai < dev.balance(dtype) else "compute",
                    attainable, attainable / peak, we, t)


@lru_cache(maxsize=65536)  # a search prices the same few hundred shapes ~10⁵ times (Device hashes by identity)
def gemm_time(g: Gemm, dev: Device, dtype: str) -> float:
    return roofline(g, dev, dtype).time


def layer_gemms(model: ModelSpec, b: int, tp: int, ep: int = 1, sp: bool = False, etp: int = 1) -> list[Gemm]:
    """The forward GEMMs of one decoder layer on one TP rank (Megatron column/row split).

    A mixture-of-experts layer (models.ModelSpec.moe) has, in place of the dense MLP, the router (its tokens'
    logits over the E experts) and one grouped GEMM per expert matrix over the E/ep experts this rank holds
    (`batch`: one kernel, Megatron-Core's GroupedMLP / TE's grouped linear), each expert's M the tokens it
    receives under balanced routing: this rank's b·s/tp tokens (sequence parallelism shards them; experts are
    not TP-split) × top_k copies, spread over the E experts and gathered from the ep ranks -> b·s/tp·k·ep/E.
    A shared expert is a dense MLP of its width (TP-split as one).  Expert tensor parallelism (`etp`, Megatron-Core's
    --expert-tensor-parallel-size) splits each expert's fc1 by columns and fc2 by rows over etp ranks, which all
    compute every copy their experts receive (the copies all-gathered over them): M etp times, the width 1/etp.

    Multi-head latent attention's down projections are whole on every TP rank; under sequence parallelism each
    rank runs them on its own s/tp tokens (Megatron-Core's MLASelfAttention: TELinear "duplicated" on the
    sequence shard, the latents all-gathered by the column-parallel up projections)."""
    model = model.at_ep(ep)  # (uneven routing waits on the busiest of several EP ranks: models.ModelSpec.route_load)
    s, h, t = model.seq_len, model.hidden, tp
    tok = b * s
    if model.mla:  # multi-head latent attention: the down projections whole on every TP rank, then Q's and K/V's
        # up projections and the output projection split by heads (Megatron-Core's MLASelfAttention)
        heads = model.heads // t
        down = tok // t if sp and t > 1 else tok
        proj = [Gemm("qkv_down", down, model.q_lora + model.kv_lora + model.rope_dim, h),
                Gemm("qkv", tok, heads * model.qk_head, model.q_lora or h),
                Gemm("kv_up", tok, heads * (model.head_dim + model.v_head_dim), model.kv_lora)]
    else:  # K/V replicated when tp > kv_heads: one whole K/V head per rank (models.ModelSpec)
        proj = [Gemm("qkv", tok, model.q_dim // t + 2 * round(model.kv_dim_per_rank(t)), h)]
    keys = model.attn_keys  # the sequence; fewer under chunked attention (the work its layers do, on average)
    attn = proj + [
        Gemm("attn_scores", s, keys, model.qk_head, b * model.heads // t),
        Gemm("attn_values", s, model.v_head_dim, keys, b * model.heads // t),
        Gemm("attn_out", tok, h, model.o_dim // t),
    ]
    if not model.moe:
        f_out = (2 if model.gated else 1) * model.ffn // t
        return attn + [Gemm("mlp_in", tok, f_out, h), Gemm("mlp_out", tok, h, model.ffn // t)]
    local = tok / t  # this rank's tokens entering the MoE block
    per_expert = max(1, round(local * model.routed_copies * ep * etp / model.experts))  # (the busiest rank's)
    fe = model.expert_ffn // etp
    out = attn + [Gemm("router", max(1, round(local)), model.experts, h),
                  Gemm("expert_in", per_expert, (2 if model.gated else 1) * fe, h, model.experts // ep),
                  Gemm("expert_out", per_expert, h, fe, model.experts // ep)]
    if model.shared_ffn:
        fs = model.shared_ffn
        out += [Gemm("mlp_in", tok, (2 if model.gated else 1) * fs // t, h), Gemm("mlp_out", tok, h, fs // t)]
    return out


def muon_matrices(model: ModelSpec, tp: int = 1, ep: int = 1, etp: int = 1) -> list[tuple[int, int, int, bool]]:
    """One decoder layer's weight matrices as Muon orthogonalizes them on a rank, (rows, cols, how many, whether
    they are routed experts'): the
    weights of `layer_gemms` at TP `tp` and expert TP `etp` (its shards: Megatron-Bridge's blockwise mode; 1, 1
    for the whole matrices of Megatron-Core's duplicated mode), the E/ep routed experts each its own matrix, Q, K
    and V apart (Megatron-Core's `muon_split_qkv`), multi-head latent attention's two down projections apart; the
    attention core has no weight."""
    out: list[tuple[int, int, int, bool]] = []
    for g in layer_gemms(model, 1, tp, ep, etp=etp):
        if g.name in ("attn_scores", "attn_values"):
            continue
        if g.name == "qkv" and not model.mla:  # Q, K and V apart
            out += [(model.q_dim // tp, g.k, 1, False), (round(model.kv_dim_per_rank(tp)), g.k, 2, False)]
        elif g.name == "qkv_down":  # Q's down projection and K/V's (with the shared rotary key) apart
            out += ([(model.q_lora, g.k, 1, False)] if model.q_lora else []) + [
                (model.kv_lora + model.rope_dim, g.k, 1, False)]
        else:
            out.append((g.n, g.k, g.batch, g.name.startswith("expert_")))
    return out


@lru_cache(maxsize=1024)
def newton_schulz_layer_flops(model: ModelSpec, tp: int, ep: int, etp: int, steps: int) -> tuple[float, float]:
    """One layer's Newton-Schulz FLOPs on a rank (`muon_matrices`), (the rest, the routed experts)."""
    dense = experts = 0.0
    for rows, cols, n, expert in muon_matrices(model, tp, ep, etp):
        f = n * newton_schulz_flops(rows, cols, steps)
        if expert:
            experts += f
        else:
            dense += f
    return dense, experts


def newton_schulz_flops(rows: int, cols: int, steps: int) -> float:
    """FLOPs of Muon's Newton-Schulz orthogonalization of one rows × cols matrix: with m <= n its sides, each
    quintic step is A = X·Xᵀ (2m²n), B = b·A + c·A² (2m³), X = a·X + B·X (2m²n) -- Jordan et al. 2024, "Muon"."""
    m, n = min(rows, cols), max(rows, cols)
    return steps * (4.0 * m * m * n + 2.0 * m ** 3)


def head_gemm(model: ModelSpec, b: int, tp: int) -> Gemm:
    return Gemm("head", b * model.seq_len, -(-model.vocab // tp), model.hidden)


def layer_flops(model: ModelSpec, b: int, tp: int, ep: int = 1, sp: bool = False,
                etp: int = 1) -> tuple[float, float]:
    """(GEMM FLOPs of the projections and MLP, attention-core FLOPs), forward, per TP rank."""
    gs = layer_gemms(model, b, tp, ep, sp, etp)
    core = sum(g.flops for g in gs if g.name.startswith("attn_") and g.name != "attn_out")
    return sum(g.flops for g in gs) - core, core


def seed_gemm_flops(model: ModelSpec, tokens: int, tp: int) -> float:
    """Seed §4.2: 24·B·S·H²/E (four projections + the MLP, f = 4H)."""
    return 24.0 * tokens * model.hidden**2 / tp


def elementwise_bytes(model: ModelSpec, b: int, tp: int, sp: bool, dtype: str = "bf16",
                      fp8_current: bool = False, fp8_block: str = "", ep: int = 1, dispatcher: str = "",
                      etp: int = 1) -> float:
    """HBM bytes the non-GEMM kernels of one layer's forward move on one TP rank (table model).

    Two norms (read + write T·h each); two bias+dropout+residual blocks (read the branch and the
    residual, write the sum, write a 1-byte mask: 3 elements + 1 B per T·h); the activation (GeLU:
    read + write T·f/t; SwiGLU: read 2, write 1); rotary embeddings on Q and K (read + write) for
    models without learned positions.  (Without FlashAttention the scores' softmax and dropout are the attention
    core's: `scores_bytes`, priced with it in `layer_times`.)  The T·h terms are replicated on TP ranks unless sequence parallelism
    shards them.

    A mixture-of-experts layer's MLP part (models.ModelSpec.moe): the router's fp32 softmax and top-k over the
    rank's b·s/tp tokens × E logits (read + write 4 B each), the permutation of each token into its top_k copies
    and back (read T, write k·T; read k·T, weigh, write T: 2·(1 + k)·T·h), the activation over the k·T routed
    rows at the expert width, and a shared expert's activation as a dense MLP's; the `dispatcher`'s own passes
    (`module_elementwise_bytes`).
    """
    model = model.at_ep(ep)
    d = act_bytes(dtype)
    s, h, t = model.seq_len, model.hidden, tp
    tok = b * s
    rep = 1.0 / t if sp else 1.0
    drop = 1.0 if model.bias else 0.0
    # the two norms, the activation(s), a mixture of experts' routing (module_elementwise_bytes: what the recomputation
    # modules re-run)
    by = sum(module_elementwise_bytes(model, b, tp, sp, dtype, ep, dispatcher, etp).values())
    by += 2 * (3 * d + drop) * tok * h * rep  # two bias + dropout + residual
    if model.moe:
        k, fe, fs = model.routed_copies, model.expert_ffn, model.shared_ffn
        # per token, the elements cast to fp8 at an MLP input: the routed copies (k·h) and the expert's
        # activation (k·fe) of this rank's T/tp tokens, and the shared expert's input and activation
        # (expert tensor parallelism: each rank casts the copies gathered from its etp group, at 1/etp of the width)
        mlp_in, mlp_act = k * h * etp / t + (h * rep if fs else 0.0), k * fe / t + fs / t
    else:
        mlp_in, mlp_act = h * rep, model.ffn / t
    if model.mla:  # rotary on Q's and the shared K's rotary channels; the latents' norms (whole on every TP rank)
        by += 2 * tok * (model.heads * model.rope_dim / t + model.rope_dim) * d
        by += 2 * tok * (model.q_lora + model.kv_lora) * d * rep  # (on the sequence shard under SP)
    else:  # a read and a write of every Q and K element: rotary on them, and their norms (Qwen3's q_norm / k_norm,
        # Megatron-Core's qk_layernorm: one fused kernel each; models.ModelSpec.qk_norm)
        qk_pass = 2 * tok * (model.q_dim + model.kv_dim) / t * d
        by += qk_pass * ((not model.learned_pos) + model.qk_norm)
    if dtype == "fp8":  # each GEMM input cast bf16 -> fp8 by Transformer Engine's cast-transpose (read
        # 2 B, write the fp8 copy and its transpose, 1 + 1 B: Hopper's fp8 GEMMs take only the TN layout, so
        # the backward's weight-gradient GEMM needs the transposed copy): QKV and MLP-in inputs (T·h, cast
        # before SP's all-gather), the attention output (T·h/t), the MLP activation (T·f/t)
        # MLA's up projections' inputs (0 otherwise), whole on each TP rank (cast on the sequence shard under SP)
        latent = (model.q_lora + model.kv_lora) * rep
        cast = tok * (h * rep + mlp_in + h / t + mlp_act + latent)  # the elements cast per layer forward
        by += 4 * cast
        if fp8_current:  # current scaling: each cast first reads its input for the amax ("two reads per
            # quantization" against delayed scaling's one: Transformer Engine's FP8 delayed-scaling docs); the
            # MLP activation's amax is computed inside the activation kernel (TE PR #2004), so not its cast
            by += 2 * tok * (h * rep + mlp_in + h / t + latent)
        if fp8_block:  # MXFP8 (Transformer Engine's MXFP8BlockScaling; OCP MX: one E8M0 scale per 32 elements, along
            # rows for the row-wise copy and along columns for the column-wise one): the cast finds each block's amax
            # as it reads (no second read, no TP amax all-reduce) and writes a 1 B scale per 32 elements of each copy
            by += cast * 2 / 32
            if fp8_block == "nvfp4":  # NVFP4's quantization (amaxes, the weight-gradient inputs' random Hadamard
                # transform, two scale levels, E2M1 casts) at Transformer Engine's measured cost over MXFP8's casts
                by += cast * (4 + 2 / 32) * (NVFP4_CAST_OVER_MXFP8 - 1)
    return by


def scores_bytes(model: ModelSpec, b: int, tp: int, d: float) -> float:
    """Without FlashAttention: the softmax (read + write) and, for models with biases (GPT-style, trained with
    dropout), the attention dropout (read + write + a 1-byte mask) over this TP rank's b·(a/t)·s² scores."""
    scores = b * (model.heads / tp) * model.seq_len * model.seq_len
    return scores * (2 * d + (1.0 if model.bias else 0.0) * (2 * d + 1))


def scores_backward_bytes(model: ModelSpec, b: int, tp: int, d: float) -> float:
    """Without FlashAttention, the backward of `scores_bytes`' kernels, by what they read and write (issue 12's
    forty-fourth round): the softmax's backward reads the probabilities and their gradient and writes the scores'
    gradient (Megatron's fused kernels: scaled_[upper_triang_]masked_softmax backward(output_grads, softmax_results)
    -> input_grads), 3 elements; the dropout's reads the gradient and the 1-byte mask and writes (PyTorch's
    native_dropout_backward(grad_output, mask, scale)), 2 elements + 1 B -- 1.2× the forward's bytes, not the 2× the
    step model takes for a layer's backward."""
    scores = b * (model.heads / tp) * model.seq_len * model.seq_len
    return scores * (3 * d + (1.0 if model.bias else 0.0) * (2 * d + 1))


# Megatron-Core's selective recomputation modules (TransformerConfig.recompute_modules, with recompute_granularity
# "selective"; its default list is ["core_attn"]): what each re-runs in the backward and stops storing
# (memory.layer_activation_bytes) -- the attention core; MLA's Q and K/V up projections; the two norms; a dense
# MLP; a mixture of experts' whole MoE block (router, dispatch, experts, combine: its all-to-alls again); the routed
# experts' activation function; the shared experts.
# (each with the short name the plan table's column shows, choice.Choice.recompute_label)
MODULE_ABBREV = {"core_attn": "attn", "mla_up_proj": "up", "layernorm": "ln", "mlp": "mlp", "moe": "moe",
                 "moe_act": "act", "shared_experts": "shx"}
RECOMPUTE_MODULES = tuple(MODULE_ABBREV)


def module_gemms(model: ModelSpec, module: str) -> tuple[str, ...]:
    """The forward GEMMs (`layer_gemms` names) a recompute module re-runs in this model's layer: MLA's Q and K/V up
    projections; a dense MLP's two; a mixture of experts' router, routed experts and shared expert (the whole block) or
    its shared expert alone; none for the attention core (its own kernel), the norms and the experts' activation."""
    if module == "mla_up_proj":
        return ("qkv", "kv_up") if model.mla else ()
    if module == "mlp":
        return () if model.moe else ("mlp_in", "mlp_out")
    if module == "moe":
        return (("router", "expert_in", "expert_out") + (("mlp_in", "mlp_out") if model.shared_ffn else ())
                if model.moe else ())
    if module == "shared_experts":
        return ("mlp_in", "mlp_out") if model.moe and model.shared_ffn else ()
    return ()


def recompute_modules(recompute: str) -> frozenset[str]:
    """The selective-recomputation modules a recompute method names: "selective" is Megatron-Core's default list
    (the attention core), "selective:m1,m2" its `recompute_modules` spelled out; every other method none."""
    if recompute == "selective":
        return frozenset({"core_attn"})
    if recompute.startswith("selective:"):
        return frozenset(m for m in recompute[len("selective:"):].split(",") if m)
    return frozenset()


def modules_recompute(modules: tuple[str, ...] | list[str] | frozenset[str]) -> str:
    """The recompute method of a module list, in one spelling ("selective" for the default list alone)."""
    mods = sorted(set(modules))
    return "selective" if mods == ["core_attn"] else "selective:" + ",".join(mods)


def recomputes_core(recompute: str) -> bool:
    """Whether the method re-runs the attention core (and so stores no attention scores)."""
    return "core_attn" in recompute_modules(recompute)


@dataclass(frozen=True)
class LayerTimes:
    fwd: float  # one layer forward, one micro-batch, seconds (roofline + waves [+ elementwise])
    core: float  # the attention-core part of fwd (what selective recompute redoes)
    head_fwd: float  # the output head's forward GEMM [+ the loss's traffic] (last stage only)
    fwd_flops: float
    core_flops: float
    head_flops: float
    elementwise: float = 0.0  # the non-GEMM part of fwd (table model)
    op_rec: float = 0.0  # what torchtitan's selective op recomputation redoes (`op_shares`): its GEMMs + elementwise
    # each selective-recomputation module's forward time in this layer (`RECOMPUTE_MODULES`; 0 where the layer has no
    # such module: a dense layer's "moe", an MHA layer's "mla_up_proj"): (name, seconds), table model only
    modules: tuple[tuple[str, float], ...] = ()
    head_gemm: float = 0.0  # the head's GEMM alone (head_fwd without the loss): the size of its weight gradient
    # the layer's forward GEMMs but the attention core's, set where they are priced (what is added to `fwd` later --
    # CP's extra attention blocks and their launches, ring copies -- is not a weight's): one weight-gradient GEMM of the
    # same size each, what a split backward's weight half (BW) runs
    weight_gemms: float = 0.0

    def recomputed(self, recompute: str) -> float:
        """What one layer's recomputation redoes in the backward, by method: the whole forward ("full"),
        the attention core ("selective"), Megatron-Core's named modules ("selective:m1,m2"), torchtitan's selective
        ops ("op"), nothing ("none")."""
        if recompute.startswith("selective:"):
            mods = recompute_modules(recompute)
            times = dict(self.modules)
            return (self.core if "core_attn" in mods else 0.0) + sum(times.get(m, 0.0) for m in mods - {"core_attn"})
        return {"none": 0.0, "selective": self.core, "full": self.fwd, "op": self.op_rec}[recompute]


def loss_time(model: ModelSpec, dev: Device, b: int, tp: int, cross_entropy: str = "unfused") -> float:
    """The loss's cross-entropy over one micro-batch's logits (b·s·V/tp on this rank, b·s·V gathered), forward and backward: its
    implementation's HBM bytes per logit (`LOSS_BYTES`) at the GPU's elementwise share of HBM (table model)."""
    return LOSS_BYTES[cross_entropy] * b * model.seq_len * loss_vocab(model.vocab, tp, cross_entropy) / (
        dev.mem_bw * dev.mem_eff)


def op_shares(model: ModelSpec) -> dict[str, float]:
    """The share of each forward GEMM that torchtitan's "selective op" activation checkpointing recomputes.
    Its policy (torchtitan's _apply_ac_to_transformer_block, selective_ac_option "op") saves the outputs of
    matmuls, attention and collectives but recomputes every second matmul of a block, in call order
    wq, wk, wv, wo, w1, w3, w2 (gated MLP; fc1, fc2 otherwise), and every other op (norms, rotary, activation,
    products, residuals).  In the fused GEMMs priced here: K's part of the QKV GEMM, the output projection,
    half of a gated MLP's input GEMM (w3) or a plain MLP's output GEMM (fc2) -- of the routed experts' grouped
    GEMMs likewise in a mixture of experts (and of a shared expert's)."""
    q, kv = model.q_dim, model.kv_dim
    shares = {"qkv": kv / (q + 2 * kv), "attn_out": 1.0}
    pairs = [("mlp_in", "mlp_out")]
    if model.moe:
        pairs = [("expert_in", "expert_out")] + (pairs if model.shared_ffn else [])
    for fc1, fc2 in pairs:
        shares.update({fc1: 0.5} if model.gated else {fc2: 1.0})
    return shares


@lru_cache(maxsize=8192)
def layer_times(model: ModelSpec, dev: Device, dtype: str, b: int, tp: int, sp: bool = False,
                flash: bool = False, fp8_current: bool = False, cross_entropy: str = "unfused",
                fp8_block: str = "", ep: int = 1, dispatcher: str = "", etp: int = 1,
                eager: bool = False) -> LayerTimes:
    """One layer's forward on one TP rank; the backward is priced as twice it.  `eager`: the non-GEMM kernels are
    par3d's own runtime's, eager PyTorch (plan/eager.py), not Megatron-Core's fused ones (`elementwise_bytes`)."""
    gs = layer_gemms(model, b, tp, ep, sp, etp)
    hg = head_gemm(model, b, tp)
    gemm, core_f = layer_flops(model, b, tp, ep, sp, etp)
    shares = op_shares(model)
    if dev.kernel_model != "table":
        times = {g.name: gemm_time(g, dev, dtype) for g in gs}
        core = times["attn_scores"] + times["attn_values"]
        op = sum(times[k] * f for k, f in shares.items())
        head, total = gemm_time(hg, dev, dtype), sum(times.values())
        return LayerTimes(total, core, head, gemm + core_f, core_f, hg.flops, op_rec=op, head_gemm=head,
                          weight_gemms=total - core)
    # MXFP8's and NVFP4's GEMMs at their own measured rates (hardware.with_mxfp8 / with_nvfp4), the others at the dtype's
    gdt = layer_gemm_dtype(dev, dtype, fp8_block)
    times = {g.name: gemm_time(g, dev, gdt if g.name not in ("attn_scores", "attn_values") else dtype)
             for g in gs if not (flash and g.name in ("attn_scores", "attn_values"))}
    if flash:  # one fused kernel doing the causal half of the counted core FLOPs; under fp8 it runs
        # in bf16 (Transformer Engine's DotProductAttention: fp8 attention only with fp8_dpa, off by default)
        # at its measured share for this sequence length (a CP rank's block: the local model's; Device.attn_share)
        # chunked attention's layers at the kernel's share for their chunk, each kind weighted by its part of the work
        # (ModelSpec.attention_spans; one kind, the sequence, without chunks)
        spans, peak = model.attention_spans(), dev.peak(ATTN_DTYPE.get(dtype, dtype))
        if len(spans) == 1:
            core = 0.5 * core_f / (peak * dev.attn_share(spans[0][2])) + KERNEL_S
        else:
            work = sum(share * w for share, w, _ in spans)
            core = sum(0.5 * core_f * share * w / work / (peak * dev.attn_share(span)) for share, w, span in spans)
            core += KERNEL_S
    elif model.attn_keys != model.seq_len:  # an eager softmax over a masked matrix: the whole s x s is computed
        full = {g.name: replace(g, n=model.seq_len) if g.name == "attn_scores" else replace(g, k=model.seq_len)
                for g in gs if g.name in ("attn_scores", "attn_values")}
        core = gemm_time(full["attn_scores"], dev, dtype) + gemm_time(full["attn_values"], dev, dtype)
    else:
        core = times["attn_scores"] + times["attn_values"]
    if eager and not (model.moe or model.mla):
        # the eager block's forward and backward bytes, a third of them on the forward (the backward is priced as
        # twice the forward: the step's total is then exact; eager.py); the attention's scores are the fused
        # kernel's or, without it, priced with the core below
        fwd_b, bwd_b = block_bytes(model, b, tp, sp, act_bytes(dtype))
        nbytes = (fwd_b + bwd_b) / 3
    else:  # (the scores' softmax and dropout without FlashAttention: with the core, below)
        nbytes = elementwise_bytes(model, b, tp, sp, dtype, fp8_current, fp8_block, ep, dispatcher, etp)
    elem = nbytes / (dev.mem_bw * dev.mem_eff)
    if not flash:  # the scores' softmax and dropout, forward and backward (`scores_backward_bytes`), a third of them in
        # the forward as the step's backward is twice it, so their step total is exact (a full recomputation then
        # redoes 2/3 of their forward bytes, not all); part of the attention core, which Megatron's selective
        # recomputation checkpoints whole (CoreAttention: the score GEMM, the softmax, the dropout, the value GEMM;
        # Korthikanti et al. 2022 §5) and so re-runs (issue 12's forty-fourth round)
        d = act_bytes(dtype)
        core += (scores_bytes(model, b, tp, d) + scores_backward_bytes(model, b, tp, d)) / 3 / (dev.mem_bw * dev.mem_eff)
    others = sum(v for k, v in times.items() if k not in ("attn_scores", "attn_values"))
    # the loss as a third of the head's forward, since the backward is priced as 2 × the forward
    loss = loss_time(model, dev, b, tp, cross_entropy) / 3
    # the output layer is Megatron-Core's own ColumnParallelLinear, not a Transformer Engine module: bf16
    head_dtype = ATTN_DTYPE.get(dtype, dtype)
    op = sum(times[k] * f for k, f in shares.items()) + elem
    bw = dev.mem_bw * dev.mem_eff
    parts = module_elementwise_bytes(model, b, tp, sp, dtype, ep, dispatcher, etp)
    # each module: its GEMMs (`module_gemms`) and the traffic it re-runs
    redo = {"mlp": parts["act"], "moe": parts["route"] + parts["act"] + parts["shared_act"],
            "shared_experts": parts["shared_act"]}
    modules = (("mla_up_proj", sum(times[k] for k in module_gemms(model, "mla_up_proj"))),
               ("layernorm", parts["norms"] / bw),
               *((m, sum(times[k] for k in module_gemms(model, m)) + redo[m] / bw if module_gemms(model, m) else 0.0)
                 for m in ("mlp", "moe")),
               ("moe_act", parts["act"] / bw if model.moe else 0.0),
               ("shared_experts", sum(times[k] for k in module_gemms(model, "shared_experts")) + redo["shared_experts"]
                / bw if module_gemms(model, "shared_experts") else 0.0))
    head = gemm_time(hg, dev, head_dtype)
    return LayerTimes(others + core + elem, core, head + loss, gemm + core_f, core_f, hg.flops, elem, op, modules, head,
                      others)


def module_elementwise_bytes(model: ModelSpec, b: int, tp: int, sp: bool, dtype: str = "bf16", ep: int = 1,
                             dispatcher: str = "", etp: int = 1) -> dict[str, float]:
    """The parts of `elementwise_bytes` a selective-recomputation module re-runs (HBM bytes, one layer's forward on
    one TP rank; `elementwise_bytes` adds them up): the two norms (read + write T·h each), the MLP's activation
    (GeLU: read + write; SwiGLU: read 2, write 1 per output element; a mixture of experts': the routed copies'), a
    shared expert's activation, a mixture of experts' routing (the router's fp32 softmax and top-k, 4 B read + write
    per logit; the permutation into the experts' order and back, 2·(1 + k)·T·h).

    `dispatcher` (Megatron-Core's token dispatcher, "" where there is no expert parallelism):
    "alltoall" permutes each token into its k copies before the all-to-all and back after it (the 2·(1 + k)·T·h
    above) and, with more than one local expert (E/ep > 1), also sorts the k·T copies a rank receives by local expert
    after the dispatch and back before the combine (token_dispatcher.py's "Permutation 2" / "Unpermutation 2",
    `sort_chunks_by_idxs`): a read and a write of them each, 4·k·T·h more; with expert tensor parallelism (`etp`)
    it sorts the copies gathered from the etp group, etp times as many.  "flex" (DeepEP, HybridEP) sends the
    token's rows unpermuted, one per destination rank, and then permutes the D·T rows a rank receives (D =
    `ep_destination_ranks`) into the k·T per-expert rows and back before the combine (MoEFlexTokenDispatcher's
    dispatch_postprocess / combine_preprocess, a separate `permute` / `unpermute` after and before the
    communication kernels: issue 12's fiftieth round): 2·(D + k)·T·h."""
    model = model.at_ep(ep)
    d = act_bytes(dtype)
    tok, h, t = b * model.seq_len, model.hidden, tp
    rep = 1.0 / t if sp else 1.0
    act = 3 if model.gated else 2
    out = {"norms": 2 * 2 * tok * h * d * rep, "act": act * tok * model.ffn / t * d, "shared_act": 0.0, "route": 0.0}
    if model.moe:
        # the copies the busiest rank receives (`ModelSpec.routed_copies`: top_k under balanced routing) pass its
        # experts' activation and the permutations after the dispatch; a sender permutes its own tokens' top_k
        k, kr = model.top_k, model.routed_copies
        out["act"] = act * tok / t * kr * model.expert_ffn * d
        out["shared_act"] = act * tok * model.shared_ffn / t * d
        flex = dispatcher == "flex" and ep > 1  # the D·T rows received permuted into the copies and back
        rows_in = ep_destination_ranks(model, ep) if flex else 1.0
        out["route"] = (8.0 * tok / t * model.experts
                        + 2 * (rows_in + k) * tok / t * h * d * (model.route_load if flex else 1.0))
        if dispatcher == "alltoall" and model.experts // ep > 1:
            out["route"] += 4 * kr * tok / t * h * d * etp
    return out


def _none_drawn(pool: float, held: float, k: int) -> float:
    """The chance that k distinct experts drawn uniformly from `pool` include none of the `held` a rank holds
    (hypergeometric; real-valued pools through lgamma)."""
    if held <= 0 or k <= 0:
        return 1.0
    if pool - held < k:
        return 0.0
    return math.exp(math.lgamma(pool - held + 1) - math.lgamma(pool - held - k + 1)
                    - math.lgamma(pool + 1) + math.lgamma(pool - k + 1))


def consecutive_spans(experts: int, k: int, block: float) -> float:
    """The mean number of `block`-wide runs of experts (a rank's, or a node's) that k consecutive experts starting at
    i·k mod E touch, over the E / gcd(E, k) starts a balanced stream of tokens cycles through."""
    starts = experts // math.gcd(experts, k)
    total = 0
    for i in range(starts):
        s = (i * k) % experts
        total += len({int(((s + j) % experts) // block) for j in range(k)})
    return total / starts


def ep_destination_ranks(model: ModelSpec, ep: int) -> float:
    """The expected number of distinct EP ranks a token's top_k routed copies land on (balanced routing: the k
    experts drawn uniformly without replacement, E/ep on each rank): ep·(1 - C(E - E/ep, k) / C(E, k)).  With
    group-limited routing (models.ModelSpec.route_groups / route_group_topk: DeepSeek-V3's 8 groups, 4 per token) only
    the experts of the token's groups are drawn from, over the ranks holding them; a router that gives each token
    consecutive experts (models.ModelSpec.route_consecutive) reaches the ranks its run spans.  What the flex dispatcher
    (DeepEP, HybridEP) sends per token: one row to each such rank, not one per copy."""
    e, k = float(model.experts), model.top_k
    if ep <= 1 or e <= 0 or k <= 0:
        return 1.0
    if model.route_consecutive:  # k consecutive experts (models.ModelSpec.route_consecutive), E/ep a rank
        return consecutive_spans(model.experts, k, model.experts / ep)
    ranks, pool = float(ep), e
    g, gk = model.route_groups, model.route_group_topk
    if g and gk and gk < g:
        pool = e * gk / g
        if ep >= g:  # each group spans ep/g ranks
            ranks = ep * gk / g
        else:  # each rank holds g/ep groups: the ranks holding at least one of the token's gk groups
            ranks = ep * (1.0 - _none_drawn(float(g), g / ep, gk))
    return min(float(k), ranks * (1.0 - _none_drawn(pool, pool / ranks, k)))


def model_flops_per_sequence(model: ModelSpec) -> float:
    """Model FLOPs of one sequence, forward + backward, no recomputation (MFU's numerator,
    Chowdhery et al. 2022 App. B): 3 × (layers' forward + head forward).  For GPT this is
    72·s·l·h²·(1 + s/(6h)) + 6·s·h·V = the 6·N·tokens rule plus attention; a mixture of experts counts the
    top_k experts each token runs (and its router), the 6·N_active·tokens rule."""
    model = model.balanced()
    lt = layer_flops(model, 1, 1)
    head = head_gemm(model, 1, 1).flops
    # multi-token prediction (models.ModelSpec.mtp_layers): per module a layer, the 2h -> h projection, the head again
    mtp = model.mtp_layers * (lt[0] + lt[1] + head + 2.0 * model.seq_len * 2 * model.hidden * model.hidden)
    if model.dense_count:  # a mixture of experts' dense layers (models.ModelSpec.dense_layers, moe_step)
        ld = layer_flops(model.dense_variant(), 1, 1)
        return 3.0 * (model.moe_layers * (lt[0] + lt[1]) + model.dense_count * (ld[0] + ld[1]) + head + mtp)
    return 3.0 * (model.layers * (lt[0] + lt[1]) + head + mtp)


def attention_core_flops_per_sequence(model: ModelSpec) -> float:
    """The attention core's part of `model_flops_per_sequence` (QKᵀ and ·V over the whole s × s, forward + backward,
    multi-token prediction's layers included): what a count that halves causal attention leaves out half of."""
    model = model.balanced()
    lt = layer_flops(model, 1, 1)
    if model.dense_count:
        ld = layer_flops(model.dense_variant(), 1, 1)
        layers = model.moe_layers * lt[1] + model.dense_count * ld[1]
    else:
        layers = model.layers * lt[1]
    return 3.0 * (layers + model.mtp_layers * lt[1])


def recompute_flops_per_sequence(model: ModelSpec, recompute: str) -> float:
    """Extra forward FLOPs spent recomputing (hardware FLOPs − model FLOPs)."""
    model = model.balanced()
    if model.dense_count:  # the MoE layers' and the dense layers' apart
        return (recompute_flops_per_sequence(replace(model, dense_layers=0, moe_step=1), recompute) * model.moe_layers
                / model.layers + recompute_flops_per_sequence(model.dense_variant(), recompute)
                * model.dense_count / model.layers)
    gemm, core = layer_flops(model, 1, 1)
    if recompute == "full":
        return model.layers * (gemm + core)
    if recompute == "selective":
        return model.layers * core
    if recompute.startswith("selective:"):  # Megatron-Core's named modules: their GEMMs (and the core)
        fl = {g.name: g.flops for g in layer_gemms(model, 1, 1)}
        mods = recompute_modules(recompute)
        names = dict.fromkeys(k for m in RECOMPUTE_MODULES if m in mods for k in module_gemms(model, m))  # once each
        return model.layers * (sum(fl[k] for k in names) + (core if "core_attn" in mods else 0.0))
    if recompute == "op":
        fl = {g.name: g.flops for g in layer_gemms(model, 1, 1)}
        # (a mixture of experts' grouped GEMMs: the same FLOPs at ep = 1)
        return model.layers * sum(fl[k] * f for k, f in op_shares(model).items())
    return 0.0
