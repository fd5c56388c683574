"""One configuration's layout (`Choice`: the parallel degrees, micro-batching, schedule, recomputation and
ZeRO stage) and the modelling options that are not part of it (`Options`): the types cost.py prices."""

from __future__ import annotations

from dataclasses import dataclass

from .compute import MODULE_ABBREV
from .hardware import Cluster


@dataclass(frozen=True)
class Choice:
    tp: int
    pp: int
    dp: int
    micro_batch: int
    microbatches: int
    schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"
    zero_stage: int = 0
    sequence_parallel: bool = False
    cp: int = 1  # context-parallel degree (ring attention); mesh order tp, cp, pp, dp
    # HSDP: the DP group splits into dp_replicate replicas of dp / dp_replicate ranks each (the inner,
    # nearer ranks); ZeRO shards its states over one replica (× cp) and all-reduces the shards' gradients
    # across replicas.  torchtitan's data_parallel_replicate_degree, FSDP's HYBRID_SHARD, Megatron-Core's
    # num_distributed_optimizer_instances, DeepSpeed's MiCS.  1: ZeRO shards over the whole group.
    dp_replicate: int = 1
    # full recomputation of only the first `recompute_layers` layers of every chunk (Megatron-LM's
    # --recompute-method block --recompute-num-layers N); 0: every layer (recompute == "full" only)
    recompute_layers: int = 0
    # expert parallelism (a mixture of experts: models.ModelSpec.moe): the routed experts split over ep ranks of the
    # tp × cp × dp ranks of a stage (Megatron-Core's parallel folding, expert-tensor-parallel size 1), E/ep whole
    # experts each; the ranks holding the same experts (expert_dp of them) reduce their gradients together
    ep: int = 1
    # expert tensor parallelism (Megatron-Core's --expert-tensor-parallel-size): each routed expert's fc1 column-split
    # and fc2 row-split over etp ranks, innermost in the expert grid (etp x ep x expert_dp = tp x cp x dp); the
    # received copies all-gathered over them before the experts and reduce-scattered after (ep_exchange)
    etp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_shards(self) -> int:
        """Ranks one layer's routed experts are spread over: ep x etp (each rank holds 1/(ep·etp) of them)."""
        return self.ep * self.etp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same routed-expert shard: a stage's tp × cp × dp ranks over ep × etp."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    @property
    def dp_split(self) -> str:
        """HSDP's DP group as replicas x shard ranks ("4x8")."""
        return f"{self.dp_replicate}x{self.dp // self.dp_replicate}"

    @property
    def recompute_label(self) -> str:
        """The recomputation, with the block method's layers per chunk ("full(5)"); Megatron-Core's named modules
        shortened for a table column ("sel:up,act" for selective:mla_up_proj,moe_act; the JSON keeps the names)."""
        if self.recompute.startswith("selective:"):
            return "sel:" + ",".join(MODULE_ABBREV.get(m, m) for m in self.recompute[len("selective:"):].split(","))
        return f"{self.recompute}({self.recompute_layers})" if self.recompute_layers else self.recompute

    @property
    def zero_shards(self) -> int:
        """Ranks one ZeRO state is sharded over: the DP replica's dp / dp_replicate ranks × cp."""
        return (self.dp // self.dp_replicate) * self.cp

    def label(self) -> str:
        v = f" v={self.virtual_stages}" if self.virtual_stages > 1 else ""
        cp = f" cp={self.cp}" if self.cp > 1 else ""
        rep = f"({self.dp_split})" if self.dp_replicate > 1 else ""
        ep = (f" ep={self.ep}" if self.ep > 1 else "") + (f" etp={self.etp}" if self.etp > 1 else "")
        return (f"tp={self.tp}{cp} pp={self.pp} dp={self.dp}{rep}{ep} mb={self.micro_batch} m={self.microbatches} "
                f"{self.schedule}{v} recompute={self.recompute_label} zero={self.zero_stage} "
                f"sp={'on' if self.sequence_parallel else 'off'}")


def fsdp_unit_priced(cluster: Cluster, c: Choice) -> bool:
    """Whether `stage_times` charges PyTorch FSDP's per-unit cost (hardware.FSDP_UNIT_S): `--fsdp` on a GPU
    cluster, its sharding strategies (ZeRO-2 SHARD_GRAD_OP, ZeRO-3 FULL_SHARD / HSDP), more than one rank
    holding the same weights."""
    return cluster.fsdp and cluster.hier and c.zero_stage >= 2 and c.dp * c.cp > 1


def recomputed_layers(c: Choice, n: int) -> int:
    """Layers of an n-layer chunk that pay a layer's recompute (the forward under full recomputation, the
    attention core under selective, nothing under none): every layer, or the first `c.recompute_layers`
    under Megatron-LM's block method (full recomputation only)."""
    return min(n, c.recompute_layers) if c.recompute_layers > 0 else n


@dataclass(frozen=True)
class Options:
    """Modelling choices that are not part of the layout (flags of `par3d plan`)."""

    memory_accounting: str = "seed"  # "seed" (16 B/param) or "megatron" (fp32 main grads): memory.py
    memory_headroom: float = 0.05  # share of capacity a fitting plan leaves free (allocator, spikes)
    optimizer_dtype: str = "fp32"  # Adam's state dtype: "bf16" = NeMo's distributed_fused_adam dtype bf16 (memory.py)
    flash_attention: bool = False  # blockwise attention: no s² scores stored (always so with cp > 1)
    # rank plans whatever memory.py says of them (each still reports `fits` against `capacity`): to price a
    # published layout the memory model rejects (`par3d plan --ignore-memory`), as the validation set prices
    # its `evaluate_unfit` rows
    ignore_memory: bool = False

    def capacity(self, cluster: Cluster) -> float:
        """Bytes a fitting plan may use."""
        return cluster.device.mem_bytes * (1.0 - self.memory_headroom)


DEFAULT_OPTIONS = Options()
