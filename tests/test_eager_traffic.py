"""plan/eager.py counts the HBM bytes of par3d's own block run as eager PyTorch; here the real `model.Block` is
traced (every aten op it dispatches, forward and backward, on this CPU in bf16) and the sums compared.  Each op
is charged its inputs and outputs once (an expanded view at its storage's size; views are free), GEMMs and the
attention kernel left out, as the planner prices those apart."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from par3d import model as M
from par3d.config import ModelConfig
from par3d.mesh import Group
from par3d.plan.eager import block_bytes
from par3d.plan.models import ModelSpec

NOT_ELEMENTWISE = ("mm", "addmm", "bmm", "ones_like")  # GEMMs, and the test's own output gradient


class Traffic(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.is_view or name in NOT_ELEMENTWISE or "scaled_dot_product" in name or name in ("detach", "alias", "_unsafe_view"):
            return out
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor) and t.dim() > 0]
        self.bytes += sum(min(t.numel() * t.element_size(), t.untyped_storage().nbytes()) for t in tensors)
        return out


def traced(arch: str, h: int, heads: int, kv: int, f: int, s: int, b: int) -> int:
    cfg = ModelConfig(vocab=256, seq_len=s, layers=1, hidden=h, heads=heads, kv_heads=kv, ffn_hidden=f,
                      arch=arch).fill_arch()
    blk = M.Block(cfg, M.ModelContext(tp=Group("tp", [0], 0), seed=0, dtype=torch.bfloat16), 0)
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    with Traffic() as t:
        y = blk(x)
        y.backward(torch.ones_like(y))
    return t.bytes


@pytest.mark.parametrize("arch, h, heads, kv, f, s, b", [
    ("gpt", 256, 8, 8, 1024, 64, 2),     # LayerNorm, biases, GeLU, learned positions, one Q|K|V projection
    ("gpt", 192, 4, 4, 512, 32, 3),
    ("llama", 256, 8, 2, 688, 64, 2),    # RMSNorm, rotary, SwiGLU, grouped-query attention
    ("llama", 256, 8, 8, 512, 32, 2),    # the same with as many K/V heads as queries
    ("llama", 512, 8, 1, 1376, 64, 1),   # one K/V head
])
def test_eager_block_bytes_match_the_runtime(arch, h, heads, kv, f, s, b):
    llama = arch == "llama"
    spec = ModelSpec("t", 1, h, heads, s, 256, ffn_hidden=f, kv_heads=kv, gated=llama, learned_pos=not llama,
                     bias=not llama, norm="rms" if llama else "layer")
    fwd, bwd = block_bytes(spec, b)
    # within 3 %: the rotary embedding's angle tables (s x head_dim, fp32) and the norms' per-token statistics
    # are left out of the count
    assert fwd + bwd == pytest.approx(traced(arch, h, heads, kv, f, s, b), rel=0.03)


def test_eager_accounting_prices_llama_blocks_above_fused_ones():
    """The planner with --elementwise eager: a Llama-style layer moves several times the fused bytes (fp32 norms
    and rotary, unfused SwiGLU), a GPT-style one about the same; GEMMs unchanged."""
    from par3d.plan.compute import layer_times
    from par3d.plan.hardware import get_device

    dev = get_device("h200")
    llama = ModelSpec("l", 16, 2048, 16, 4096, 50304, ffn_hidden=5632, kv_heads=4, gated=True, learned_pos=False,
                      bias=False, norm="rms")
    gpt = ModelSpec("g", 24, 2048, 16, 2048, 50304)
    for m, lo, hi in ((llama, 3.0, 8.0), (gpt, 0.8, 1.5)):
        fused = layer_times(m, dev, "bf16", 2, 1, flash=True)
        eager = layer_times(m, dev, "bf16", 2, 1, flash=True, eager=True)
        assert lo < eager.elementwise / fused.elementwise < hi
        assert eager.fwd - eager.elementwise == pytest.approx(fused.fwd - fused.elementwise)
    with pytest.raises(ValueError, match="mixture-of-experts"):
        block_bytes(ModelSpec("moe", 1, 256, 8, 64, 256, experts=8, top_k=2), 1)
