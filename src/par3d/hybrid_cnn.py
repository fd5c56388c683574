"""A hybrid-parallel CNN: data-parallel convolutions, tensor-parallel fully-connected layers.

The seed (section 2.3, "CNN 的分层策略", slides 17-18) splits a CNN by what each layer is made of:

  convolutions     ~90-95 % of the FLOPs, ~5 % of the parameters, large activations
                   -> data parallelism: the replicas are cheap and the activations are split;
  fully-connected  ~5-10 % of the FLOPs, ~95 % of the parameters, small activations
                   -> tensor parallelism: the weights are split and only activations travel.

Its accounting table for a layer y = W x, W of C_out x C_in, batch B: data parallelism moves the
parameters (C_out·C_in per layer, once per step, independent of B); tensor parallelism moves
activations (B·C_in or B·C_out per layer, independent of the parameters).

Here all N ranks form ONE group used both ways:

  conv layers   replicated; rank r runs samples [r·B/N, (r+1)·B/N) of the batch; after backward each
                conv layer's gradient is all-reduced (SUM, see `HybridCNN.sync_gradients`);
  layout switch all-gather of the flattened conv features along the batch (B/N x C -> B x C), whose
                backward keeps this rank's slice of the gradient;
  fc1           ColumnParallelLinear over the same ranks (its f operator all-reduces dx in backward:
                right, because its input is now replicated);
  fc2           RowParallelLinear (g: all-reduce of the B x C_out partial logits forward);
  loss          on the full logits, identical on every rank, averaged over the full batch B.

Why conv gradients are summed, not averaged: every rank's loss is the full-batch loss, and the
backward of the layout switch hands rank r exactly d(loss)/d(features of its own samples).  Rank r's
conv gradient is therefore the contribution of its samples to the full-batch gradient, and the
full gradient is the sum over ranks (checked against one process in tests/test_hybrid_cnn.py).

`mode="dp"` is the comparison point: every layer replicated, each rank's loss is its share
(sum over its samples / B) and every layer's gradient is all-reduced (SUM).

Every collective runs on the world group, tagged per layer ("world/conv1", ..., "world/fc2": the
same process group, a different name) so that `comm.COUNTER` attributes each byte to a layer.
Bytes are the logical payload COUNTER records (the tensor all-reduced, the full output of an
all-gather), not the ring's 2(N-1)/N wire bytes per rank: the seed's table uses the same units.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from par3d import comm
from par3d.mesh import Group
from par3d.tensor_parallel import ColumnParallelLinear, RowParallelLinear, full_init, unshard

BYTES_FP32 = 4
MODES = ("hybrid", "dp")


@dataclass
class CNNConfig:
    image: int = 16                              # input is 3 x image x image
    channels: tuple[int, ...] = (16, 32)         # conv layers: 3x3, pad 1, ReLU, 2x2 max-pool each
    fc_hidden: int = 512                         # fc1: C_feat -> fc_hidden, fc2: fc_hidden -> classes
    classes: int = 10
    batch: int = 32                              # global batch B (divisible by the number of ranks)
    lr: float = 0.02
    momentum: float = 0.9
    seed: int = 0
    mode: str = "hybrid"                         # "hybrid" or "dp" (all data-parallel)

    @property
    def features(self) -> int:
        side = self.image // 2 ** len(self.channels)
        return self.channels[-1] * side * side

    def layer_shapes(self) -> list[dict[str, Any]]:
        """[{name, kind, c_in, c_out, k}] in forward order."""
        rows, c_in = [], 3
        for i, c in enumerate(self.channels):
            rows.append({"name": f"conv{i + 1}", "kind": "conv", "c_in": c_in, "c_out": c, "k": 3})
            c_in = c
        rows.append({"name": "fc1", "kind": "fc", "c_in": self.features, "c_out": self.fc_hidden, "k": 1})
        rows.append({"name": "fc2", "kind": "fc", "c_in": self.fc_hidden, "c_out": self.classes, "k": 1})
        return rows


def world_group(tag: str, n: int | None = None, rank: int | None = None) -> Group:
    """The group of every rank, named world/<tag> so COUNTER books its traffic under that layer."""
    if n is None:
        n = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
    pg = dist.group.WORLD if n > 1 else None
    return Group(f"world/{tag}", list(range(n)), rank or 0, pg)


# ---- the layout switch ------------------------------------------------------------------------

class _GatherBatch(torch.autograd.Function):
    """DP -> TP layout switch: all-gather along the batch forward; backward keeps this rank's rows
    (the gradient arriving here is already complete: fc1's f operator summed it over ranks)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return comm.all_gather(x, group, dim=0)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        n = g.shape[0] // ctx.group.size
        return g.narrow(0, ctx.group.rank * n, n).contiguous(), None


def gather_batch(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _GatherBatch.apply(x, group)


# ---- the model ---------------------------------------------------------------------------------

class HybridCNN(nn.Module):
    """conv blocks (DP) -> flatten -> layout switch -> fc1 (column TP) -> ReLU -> fc2 (row TP).

    Every weight is drawn whole from (seed, name) and sliced (tensor_parallel.full_init), so the
    N-rank model holds exactly the pieces of the one-process model."""

    def __init__(self, cfg: CNNConfig, n: int = 1, rank: int = 0):
        super().__init__()
        if cfg.mode not in MODES:
            raise ValueError(f"mode={cfg.mode!r}: expected one of {MODES}")
        if cfg.batch % n:
            raise ValueError(f"batch={cfg.batch} not divisible by {n} ranks")
        if cfg.image % 2 ** len(cfg.channels):
            raise ValueError(f"image={cfg.image} not divisible by 2^{len(cfg.channels)} (one pool per conv)")
        self.cfg, self.n, self.rank = cfg, n, rank
        self.groups = {s["name"]: world_group(s["name"], n, rank) for s in cfg.layer_shapes()}
        self.convs = nn.ModuleList()
        for s in cfg.layer_shapes()[:-2]:
            conv = nn.Conv2d(s["c_in"], s["c_out"], 3, padding=1)
            fan_in = s["c_in"] * 9
            with torch.no_grad():
                conv.weight.copy_(full_init((s["c_out"], s["c_in"], 3, 3), math.sqrt(2 / fan_in),
                                            cfg.seed, s["name"] + ".weight"))
                conv.bias.zero_()
            self.convs.append(conv)
        f = cfg.features
        self.fc1 = ColumnParallelLinear(f, cfg.fc_hidden, self._tp_group("fc1"), seed=cfg.seed, name="fc1",
                                        std=math.sqrt(2 / f))
        self.fc2 = RowParallelLinear(cfg.fc_hidden, cfg.classes, self._tp_group("fc2"), seed=cfg.seed,
                                     name="fc2", std=math.sqrt(1 / cfg.fc_hidden))

    def _tp_group(self, name: str) -> Group:
        # hybrid: the FC layer is split over the world; dp: every rank holds it whole (a group of one)
        return self.groups[name] if self.cfg.mode == "hybrid" else Group(name, [0], 0)

    def local_rows(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's share of a global batch (the DP part always splits the batch)."""
        b = batch.shape[0] // self.n
        return batch[self.rank * b:(self.rank + 1) * b]

    def forward(self, x_local: torch.Tensor) -> torch.Tensor:
        """Input: this rank's B/N images.  Output: logits for the full batch (hybrid) or for this
        rank's rows (dp)."""
        h = x_local
        for conv in self.convs:
            h = F.max_pool2d(F.relu(conv(h)), 2)
        h = h.flatten(1)
        if self.cfg.mode == "hybrid":
            h = gather_batch(h, self.groups["fc1"])  # the layout switch: B/N x C -> B x C
        return self.fc2(F.relu(self.fc1(h)))

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The quantity each rank differentiates; its gradients summed over ranks are the gradient
        of the full-batch mean cross-entropy in both modes."""
        logits = self.forward(self.local_rows(x))
        if self.cfg.mode == "hybrid":
            return F.cross_entropy(logits, y)  # full batch, identical on every rank
        return F.cross_entropy(logits, self.local_rows(y), reduction="sum") / y.shape[0]

    def synced_layers(self) -> dict[str, list[nn.Parameter]]:
        """The layers whose gradients are all-reduced: conv layers always, FC layers in dp mode
        (in hybrid each rank's FC gradient is already the full-batch one for its shard)."""
        names = [s["name"] for s in self.cfg.layer_shapes()]
        mods: list[nn.Module] = [*self.convs, self.fc1, self.fc2]
        layers = {n: list(m.parameters()) for n, m in zip(names, mods)}
        return layers if self.cfg.mode == "dp" else {n: p for n, p in layers.items() if n.startswith("conv")}

    def sync_gradients(self) -> None:
        """One all-reduce (SUM) of each synced layer's weight+bias gradient — C_out·C_in·k·k + C_out
        elements, the seed's "DP moves the parameters"."""
        for name, params in self.synced_layers().items():
            grads = [p.grad for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            comm.all_reduce(flat, self.groups[name])
            for g, summed in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(summed.view_as(g))

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter as the one-process model holds it (FC shards gathered; collective)."""
        out = {}
        for name, p in self.named_parameters():
            group = self.fc1.group if name.startswith("fc1") else self.fc2.group
            out[name] = unshard(p.detach(), p, group).cpu().clone()
        return out


# ---- the byte report ---------------------------------------------------------------------------

def predicted_bytes(cfg: CNNConfig, n: int) -> list[dict[str, Any]]:
    """Per layer and step, the logical bytes each layout moves (seed 2.3's table; fp32).

      all-DP, every layer     all-reduce of its gradient:   (C_out·C_in·k² + C_out) · 4
      hybrid, conv layers     the same
      hybrid, fc1 (column)    layout-switch all-gather B·C_in (forward)
                              + f's all-reduce of dx   B·C_in (backward)   -> 2·B·C_in · 4
      hybrid, fc2 (row)       g's all-reduce of the logits B·C_out (forward; backward is free)
                                                                           ->   B·C_out · 4
    On one rank nothing moves."""
    rows = []
    b = cfg.batch
    for s in cfg.layer_shapes():
        params = s["c_out"] * s["c_in"] * s["k"] ** 2 + s["c_out"]
        dp = params * BYTES_FP32
        dp_formula = f"({s['c_out']}·{s['c_in']}" + (f"·{s['k']}²" if s["k"] > 1 else "") + f"+{s['c_out']})·4"
        if s["kind"] == "conv":
            hyb, hyb_formula = dp, "same as DP (gradient all-reduce)"
        elif s["name"] == "fc1":
            hyb, hyb_formula = 2 * b * s["c_in"] * BYTES_FP32, f"2·B·C_in·4 = 2·{b}·{s['c_in']}·4"
        else:
            hyb, hyb_formula = b * s["c_out"] * BYTES_FP32, f"B·C_out·4 = {b}·{s['c_out']}·4"
        if n == 1:
            dp = hyb = 0
        rows.append({"layer": s["name"], "kind": s["kind"], "c_in": s["c_in"], "c_out": s["c_out"],
                     "k": s["k"], "params": params, "dp_bytes": dp, "dp_formula": dp_formula,
                     "hybrid_bytes": hyb, "hybrid_formula": hyb_formula})
    return rows


def measured_bytes(cfg: CNNConfig) -> dict[str, int]:
    """COUNTER's bytes per layer (every kind) since its last reset."""
    out = {s["name"]: 0 for s in cfg.layer_shapes()}
    for (group, _kind), nbytes in comm.COUNTER.bytes.items():
        if group.startswith("world/") and group[6:] in out:
            out[group[6:]] += nbytes
    return out


def format_report(rows: list[dict[str, Any]], cfg: CNNConfig, n: int) -> str:
    head = (f"bytes per step, N={n} ranks, B={cfg.batch}, fp32, logical payload "
            f"(COUNTER's units, not ring wire bytes)")
    measured_key = "measured_dp_bytes" if cfg.mode == "dp" else "measured_hybrid_bytes"
    measured_col = "meas. DP" if cfg.mode == "dp" else "measured"
    cols = (f"{'layer':<6} {'params':>8} {'all-DP':>10} {'hybrid':>10} {measured_col:>10} {'DP/hyb':>7}"
            f"  {'all-DP formula':<20}  hybrid formula")
    lines = [head, cols, "-" * len(cols)]
    tot = {"dp": 0, "hyb": 0, "meas": 0}
    for r in rows:
        meas = r.get(measured_key, "")
        ratio = f"{r['dp_bytes'] / r['hybrid_bytes']:.1f}x" if r["hybrid_bytes"] else "-"
        lines.append(f"{r['layer']:<6} {r['params']:>8} {r['dp_bytes']:>10} {r['hybrid_bytes']:>10} "
                     f"{meas:>10} {ratio:>7}  {r['dp_formula']:<20}  {r['hybrid_formula']}")
        tot["dp"] += r["dp_bytes"]
        tot["hyb"] += r["hybrid_bytes"]
        tot["meas"] += meas if isinstance(meas, int) else 0
    lines.append(f"{'total':<6} {sum(r['params'] for r in rows):>8} {tot['dp']:>10} {tot['hyb']:>10} "
                 f"{tot['meas']:>10}")
    return "\n".join(lines)


# ---- data --------------------------------------------------------------------------------------

PALETTE = torch.tensor([[1.0, 0.1, 0.1], [0.1, 1.0, 0.1], [0.1, 0.2, 1.0], [1.0, 1.0, 0.1], [0.9, 0.2, 0.9]])


def synthetic_batch(batch: int, image: int, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic 10-class image set: class c = colour c % 5 x stripe orientation c // 5
    (horizontal / vertical), random period, phase, brightness and noise.  Every rank draws the
    same global batch from (seed, step) and keeps its rows."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    y = torch.randint(0, 10, (batch,), generator=g)
    period = torch.randint(3, 6, (batch, 1, 1), generator=g).float()
    phase = torch.rand(batch, 1, 1, generator=g) * 2 * math.pi
    coord = torch.arange(image).float()
    rows = coord.view(1, image, 1).expand(batch, image, image)
    cols = coord.view(1, 1, image).expand(batch, image, image)
    along = torch.where((y // 5).view(-1, 1, 1) == 0, rows, cols)
    stripes = 0.5 + 0.5 * torch.sin(2 * math.pi * along / period + phase)       # [B, H, W]
    bright = 0.6 + 0.4 * torch.rand(batch, 1, 1, 1, generator=g)
    x = PALETTE[y % 5].view(batch, 3, 1, 1) * stripes.unsqueeze(1) * bright
    x = x + 0.15 * torch.randn(x.shape, generator=g)
    return x, y


# ---- training ----------------------------------------------------------------------------------

@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)
    measured: list[dict[str, int]] = field(default_factory=list)   # per step, bytes per layer
    report: list[dict[str, Any]] = field(default_factory=list)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    eval_accuracy: float | None = None
    rank: int = 0
    world: int = 1


def _device() -> torch.device:
    # under launch/torchrun a CUDA rank uses its own GPU (NCCL); otherwise the CPU (gloo)
    if torch.cuda.is_available() and dist.is_initialized():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def train(cfg: CNNConfig, steps: int, capture_params: bool = False, eval_batch: int = 0) -> dict[str, Any]:
    """Train `steps` SGD steps on this rank (all ranks call it; one process = the reference).
    Returns TrainResult as a dict (picklable for `par3d.distributed.launch`)."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    dev = _device()
    model = HybridCNN(cfg, n, rank).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    res = TrainResult(rank=rank, world=n)
    for step in range(steps):
        x, y = synthetic_batch(cfg.batch, cfg.image, cfg.seed, step)
        x, y = x.to(dev), y.to(dev)
        comm.COUNTER.reset()
        opt.zero_grad(set_to_none=True)
        loss = model.loss(x, y)
        loss.backward()
        model.sync_gradients()
        opt.step()
        res.measured.append(measured_bytes(cfg))
        logged = loss.detach().clone()
        if cfg.mode == "dp" and n > 1:
            # logging only (each rank holds its share of the loss): not training traffic, so it
            # bypasses the counted collectives
            dist.all_reduce(logged)
        res.losses.append(float(logged))
    res.report = predicted_bytes(cfg, n)
    if res.measured:
        for row in res.report:
            row["measured_hybrid_bytes" if cfg.mode == "hybrid" else "measured_dp_bytes"] = \
                res.measured[-1][row["layer"]]
    if eval_batch:
        x, y = synthetic_batch(eval_batch, cfg.image, cfg.seed + 7919, 0)  # held out: another seed
        with torch.no_grad():
            logits = model(model.local_rows(x.to(dev)))
        correct = (logits.argmax(-1).cpu() == (y if cfg.mode == "hybrid" else model.local_rows(y))).sum()
        if cfg.mode == "dp" and n > 1:
            correct = correct.to(dev)
            dist.all_reduce(correct)
        res.eval_accuracy = float(correct) / eval_batch
    if capture_params:
        res.params = model.full_parameters()
    return asdict(res)
