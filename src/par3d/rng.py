"""Random streams for dropout under tensor and sequence parallelism.

Dropout draws its mask from the default generator of the tensor's device.  Every TP rank of a
group seeds that generator alike (train.py), which is right where the ranks hold the *same*
activations — the residual stream without sequence parallelism: their masks must agree, or the
replicas drift apart.  It is wrong where they hold *different* pieces of one activation — their
attention heads (the attention-probability dropout), or their sequence shards under sequence
parallelism: identical masks would repeat across the pieces, so the full activation's mask would
not be independent per element, as it is on one device.  Megatron-LM keeps a second,
"model-parallel" generator for such regions, seeded per TP rank (Shoeybi et al. 2019, §3;
Korthikanti et al. 2022, §4.2.2).

Here the second stream is not a generator kept alongside (whose state activation recomputation
would have to save and restore too) but derived: on entering a sharded region each rank draws one
number from the *shared* CPU stream — the same number on every TP rank, which keeps the shared
streams in step — and seeds the device generator with it and the TP rank for the region; the
generator's state is restored on leaving.  `torch.utils.checkpoint` restores the CPU stream before
it recomputes, so the recomputed region draws the same number and the same masks.

With one TP rank nothing changes: the single-device reference draws as it always did.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from par3d.mesh import Group

_SEED_RANGE = 2**62


def _generator(device: torch.device) -> torch.Generator:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


def region_seed(base: int, tp_rank: int) -> int:
    """The seed of TP rank `tp_rank`'s stream for one sharded region (distinct per rank)."""
    return (base * 1_000_003 + 2718 + 7919 * tp_rank) % 2**63


@contextmanager
def tp_sharded(group: Group, device: torch.device, active: bool = True) -> Iterator[None]:
    """Inside: this TP rank's own random stream (for dropout on its heads or sequence shard).
    A no-op with one TP rank, or when `active` is False (eval mode, no dropout)."""
    if not active or group.size == 1:
        yield
        return
    base = int(torch.randint(0, _SEED_RANGE, (1,)))  # the shared CPU stream: same draw on every TP rank
    gen = _generator(device)
    saved = gen.get_state()
    gen.manual_seed(region_seed(base, group.rank))
    try:
        yield
    finally:
        gen.set_state(saved)


class Dropout(nn.Dropout):
    """nn.Dropout whose mask comes from this TP rank's stream when the activation is sharded over
    the TP group (`sharded`: sequence parallelism), else from the stream all TP ranks share."""

    def __init__(self, p: float, group: Group, sharded: bool):
        super().__init__(p)
        self.group, self.sharded = group, sharded and group.size > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with tp_sharded(self.group, x.device, active=self.sharded and self.training and self.p > 0):
            return super().forward(x)
