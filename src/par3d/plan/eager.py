"""par3d's own runtime as eager PyTorch runs it on a GPU: the HBM bytes the non-GEMM kernels of one block move.

`compute.elementwise_bytes` prices a Megatron-Core / Transformer Engine step: fused norms, fused rotary, a fused
SwiGLU, bias and residual folded into neighbours.  `par3d train` runs `model.py` as plain PyTorch: each line of a
norm, of the rotary embedding and of the gated MLP is a kernel of its own, and the RMSNorm and the rotary embedding
work in fp32.  The second H200 lease measured what that costs (docs/measured.md §6: Llama-style runs 17-25 %
slower than a plan with fused accounting, GPT-style ones not).  This module counts those kernels' bytes from the
code, one line per kernel (each reads its inputs once and writes its outputs once; views are free), for the
switches `model.py` has: LayerNorm or RMSNorm, biases, GeLU or a gated MLP, learned or rotary positions, and
grouped-query attention's K/V expansion.  Nothing here is fitted: `tests/test_eager_traffic.py` traces the real
`model.Block` (every aten op it dispatches, forward and backward) and checks these sums against it.

Bytes are per token of one TP rank, in units of elements of the block's widths, with 16-bit activations (`d`)
and fp32 where `model.py` computes in fp32 (4 B).  `block_bytes` multiplies them out.
"""

from __future__ import annotations

from .models import ModelSpec

F32 = 4


def _rmsnorm_fwd(d: int) -> float:
    # x.float() (d + 4), pow (4 + 4), mean (4), x * rsqrt (4 + 4), .to(d) (4 + d), weight * x (d + d)
    return (d + F32) + 2 * F32 + F32 + 2 * F32 + (F32 + d) + 2 * d


def _rmsnorm_bwd(d: int) -> float:
    # the weight's product: dy * w (d + d), dy * x (d + d + d) and its sum (d); the fp32 chain: .float() (d + 4),
    # four products and a quotient of whole rows (3 x (4 + 4 + 4), 3 x (4 + 4)... as autograd writes them:
    # mul(dy, x) 12, mul(., rstd) 8, sum 4, div 8, pow 8, mul 8, mul 12, add 12), .to(d) (4 + d)
    return 2 * d + 3 * d + d + (d + F32) + 12 + 8 + 4 + 8 + 8 + 8 + 12 + 12 + (F32 + d)


def _rotary_fwd(d: int) -> float:
    # x.float() twice (2 x (d + 4)), x * cos (4 + 4), -x2 on half the channels (4), cat([-x2, x1]) (4 + 4),
    # * sin (4 + 4), the sum (4 + 4 + 4), .to(d) (4 + d)
    return 2 * (d + F32) + 8 + 4 + 8 + 8 + 12 + (F32 + d)


def _rotary_bwd(d: int) -> float:
    # dy.float() (d + 4), dy * cos (8), the half-swap's -dy (4), dy * sin (8), .to(d) (4 + d), cat of the halves
    # (4 + 4), .to(d) (4 + d), the two branches' sum (3 d)
    return (d + F32) + 8 + 4 + 8 + (F32 + d) + 8 + (F32 + d) + 3 * d


def parts(d: int = 2) -> dict[str, tuple[float, float]]:
    """The pieces `block_bytes` adds up, as (forward, backward) bytes per element of the width each acts on (the
    hidden size for norms and residuals, Q's or K's for the rotary embedding, the MLP's for the activation):
    what `par3d calibrate` times on a GPU to measure how fast eager kernels move their bytes."""
    # GeLU: read + write forward, read two and write one backward; the gated unit: act(gate) (2 d) and its product
    # with up (3 d) forward, the product rule (2 x 3 d), SiLU's backward (3 d) and the cat of [d_gate | d_up] (4 d)
    return {"layernorm": (2 * d, 3 * d), "rmsnorm": (_rmsnorm_fwd(d), _rmsnorm_bwd(d)),
            "rotary": (_rotary_fwd(d), _rotary_bwd(d)), "gelu": (2 * d, 3 * d), "swiglu": (5 * d, 13 * d),
            "residual": (3 * d, 3 * d)}


def block_bytes(model: ModelSpec, b: int, tp: int = 1, sp: bool = False, d: int = 2) -> tuple[float, float]:
    """(forward, backward) HBM bytes of one block's non-GEMM kernels on one TP rank, for a micro-batch of b
    sequences, as `model.Block` runs them in eager PyTorch (attention through one fused
    `scaled_dot_product_attention` kernel, whose traffic is the attention's own, not counted here)."""
    if model.moe or model.mla:
        raise ValueError(f"{model.name}: par3d's runtime has no mixture-of-experts or latent-attention block")
    tokens = b * model.seq_len
    x = model.hidden / tp if sp and tp > 1 else float(model.hidden)  # norms and residuals: SP shards them
    q = model.q_dim / tp
    k = model.kv_dim_per_rank(tp)  # K's width on this rank (V's is the same); one whole head when tp > kv_heads
    f = model.ffn / tp
    f_out = (2 if model.gated else 1) * f
    # multi-head attention: one fused Q|K|V projection; fewer K/V heads: Q and K|V apart, each K/V head expanded
    # to its query heads (repeat_interleave) before the attention
    grouped = model.kv_heads not in (None, model.heads)
    part = parts(d)
    norm_f, norm_b = part["layernorm" if model.norm == "layer" else "rmsnorm"]  # LayerNorm: one native kernel each way
    rot_f, rot_b = part["rotary"]
    act_f, act_b = part["swiglu" if model.gated else "gelu"]
    res_f, res_b = part["residual"]

    fwd = 2 * norm_f * x + 2 * res_f * x  # two norms, two residual adds
    if model.bias:  # the row-parallel layers' biases, added after their reduction (W_o, fc2)
        fwd += 2 * 2 * d * x
    if not model.learned_pos:
        fwd += rot_f * (q + k)
    if grouped:  # K and V copied out to every query head
        fwd += 2 * d * (k + q)
    fwd += act_f * f  # act(gate) * up, or act(y)

    bwd = 2 * norm_b * x + 2 * res_b * x  # two norms, the residual gradients' sums
    if model.bias:  # every bias's gradient: a sum over the tokens of its output's gradient
        bwd += d * (2 * x + f_out + q + 2 * k)
    if not model.learned_pos:
        bwd += rot_b * (q + k)
    if grouped:  # dK and dV summed over the heads that shared them and made contiguous, the K|V split's gradient
        # (one cat), and x's two gradients (Q's projection and K|V's) added
        bwd += 2 * d * (q + k) + 2 * 2 * d * k + 2 * d * 2 * k + 3 * d * x
    else:  # the Q|K|V split's gradient: one cat
        bwd += 2 * d * (q + 2 * k)
    bwd += act_b * f  # the activation's gradient (`parts`)
    return fwd * tokens, bwd * tokens
