"""The loss at TP 1 (torch's fused cross-entropy) against the sharded loss's own formula on one
rank: same per-token losses and logit gradients (padding columns included)."""

import torch

from par3d.mesh import Group
from par3d.tensor_parallel import _VocabParallelCrossEntropy, vocab_parallel_cross_entropy


def test_tp1_loss_matches_sharded_formula() -> None:
    g = torch.Generator().manual_seed(0)
    one = Group("tp", [0], 0)
    for vocab, cols in ((256, 256), (250, 252)):  # 252: two padding columns past the vocabulary
        logits = (3 * torch.randn(2, 64, cols, generator=g)).requires_grad_(True)
        target = torch.randint(0, vocab, (2, 64), generator=g)
        w = torch.rand(2, 64, generator=g)  # a per-token weight, so the gradient is not uniform
        fast = vocab_parallel_cross_entropy(logits, target, one, 0, vocab)
        (gf,) = torch.autograd.grad((fast * w).sum(), logits)
        ref = _VocabParallelCrossEntropy.apply(logits, target, one, 0, vocab)
        (gr,) = torch.autograd.grad((ref * w).sum(), logits)
        assert fast.shape == ref.shape == target.shape
        torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gf, gr, rtol=1e-5, atol=1e-6)
        if cols > vocab:  # padding never takes probability mass, so it gets no gradient
            assert float(gf[..., vocab:].abs().max()) == 0.0
