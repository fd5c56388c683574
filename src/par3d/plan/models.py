"""Model shapes: a catalogue by name, a Hugging Face `config.json`, or explicit dimensions.

Parameter counts follow the standard decoder layer (Narayanan et al. 2021, §5.1; seed §4.5:
≈ 12·h² per layer for h→4h MLPs):
- attention: Q and output projections h·q each (q = heads · head_dim, = h unless the heads are given a
  width of their own: Megatron's `--kv-channels`, Hugging Face's `head_dim`), K and V h·kv_dim each
  (kv_dim = kv_heads · head_dim; GQA), + biases;
- MLP: 2·h·f (GeLU) or 3·h·f (gated SwiGLU, Llama);
- two norms: 4·h for LayerNorm (weight and bias), 2·h for RMSNorm (weight only).
Embedding V·h (+ learned positions s·h for GPT); the output head V·h unless tied (and even when
tied it is a second copy when embedding and head live on different pipeline stages, as Megatron
does).

Grouped-query attention under TP (Megatron-LM, Ainslie et al. 2023): tp ≤ kv_heads splits the K/V
heads (kv_heads/tp per rank); tp > kv_heads (tp a multiple of kv_heads) replicates them, one K/V
head per rank — more K/V weights and activations per rank than kv_dim/tp.

Mixture of experts (`experts` > 0; Shazeer et al. 2017, GShard, Switch; Mixtral, Qwen-MoE, OLMoE): every
layer's MLP is a router (h·E) and E routed experts of width `moe_ffn_hidden` each (gated or not, as the model),
of which each token runs `top_k`, plus an optional always-on shared expert of width `shared_ffn` (Qwen2-MoE,
DeepSeek: n_shared × moe width).  Expert parallelism (`ep`, choice.Choice) places E/ep whole experts on each
rank (Megatron-Core's expert-tensor-parallel size 1); the attention, norms, router and shared expert split over
TP as a dense layer's do.  Leading dense layers (`dense_layers`: DeepSeek's first_k_dense_replace) and regularly
interleaved ones (`moe_step`: Llama 4 Maverick's interleave_moe_layer_step, Qwen2-MoE's decoder_sparse_step) have a
dense MLP of `ffn`; dense layers placed otherwise (Qwen2-MoE's mlp_only_layers, DeepSeek's moe_layer_freq) are
refused, not priced as uniform.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields, replace
from typing import Any


class ModelError(ValueError):
    """A model description that cannot be used; the message names the flag and a fix."""


def split_error(layers: int, split: tuple[int, ...]) -> str | None:
    """Why `split` (layers per pipeline chunk, in model order) cannot cut a model of `layers` layers, or None: the
    counts sum to the layers, none is negative, and every chunk but the first (which may hold the embedding alone)
    and the last (the head and loss alone) holds a layer."""
    if not split:
        return None
    if any(n < 0 for n in split):
        return f"layer counts must be >= 0, got {', '.join(map(str, split))}"
    if sum(split) != layers:
        return f"the counts sum to {sum(split)}, the model has {layers} layers: give counts that sum to {layers}"
    empty = [i for i, n in enumerate(split) if n == 0 and 0 < i < len(split) - 1]
    if empty:
        return (f"chunk {empty[0]} holds no layer: only the first chunk (the embedding alone) and the last (the "
                f"head and loss alone) may be empty")
    if len(split) == 1 and split[0] == 0:
        return "one chunk must hold the layers"
    return None


def fields_hash(obj: Any) -> int:
    """The hash the generated __hash__ of a frozen dataclass gives (its fields' tuple), computed once and kept on the
    instance: the planner's caches key on models and clusters up to ~10⁶ times a search."""
    h = obj.__dict__.get("_hash")
    if h is None:
        h = hash(tuple(getattr(obj, f.name) for f in fields(obj)))
        object.__setattr__(obj, "_hash", h)
    return h


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn_hidden: int | None = None  # None -> 4·hidden
    kv_heads: int | None = None  # None -> heads (multi-head attention)
    gated: bool = False  # SwiGLU MLP (3 matrices)
    tied: bool = True  # input and output embeddings share weights
    learned_pos: bool = True  # GPT-style learned position embeddings (False: rotary)
    bias: bool = True
    norm: str = "layer"  # "layer" (LayerNorm: weight + bias) or "rms" (RMSNorm: weight)
    head_size: int | None = None  # one head's width; None -> hidden // heads (Megatron's --kv-channels)
    experts: int = 0  # routed experts per layer (mixture of experts); 0: a dense MLP
    top_k: int = 0  # routed experts each token runs (MoE)
    moe_ffn_hidden: int | None = None  # one routed expert's width; None -> ffn_hidden (Mixtral's config says so)
    shared_ffn: int = 0  # the always-on shared expert's width (all shared experts together); 0: none
    dense_layers: int = 0  # MoE: the first this-many layers have a dense MLP of ffn_hidden (DeepSeek's first_k_dense)
    # MoE: after them, every moe_step-th layer is a mixture of experts and the others dense (Llama 4 Maverick's
    # interleave_moe_layer_step 2, Qwen2-MoE's decoder_sparse_step: layer u, counted from 1, is MoE when u % step == 0)
    moe_step: int = 1
    # multi-token prediction (DeepSeek-V3): this many extra modules after the last layer, each a layer of the model's
    # kind, a projection of [norm(h); norm(embedding)] (2h -> h) and a second pass of the shared output head and loss
    mtp_layers: int = 0
    # group-limited routing (DeepSeek-V3: 256 experts in 8 groups, each token's experts in at most 4 of them;
    # config.json's n_group / topk_group): bounds the nodes a token's copies reach (cp_ep_comm.ep_remote_nodes)
    route_groups: int = 0
    route_group_topk: int = 0
    # a benchmark's balanced router that gives each token k consecutive experts (NeMo AutoModel's FakeBalancedGate:
    # token i's experts are i·k … i·k + k - 1 mod E), so its copies land on as few ranks and nodes as the experts' layout
    # allows (compute.ep_destination_ranks, cp_ep_comm.ep_remote_nodes); `--router-consecutive`
    route_consecutive: bool = False
    # the busiest expert-parallel rank's routed copies over the balanced share (`routed_copies`; `--moe-load`): 1.0, as
    # the published MoE benchmarks run (Megatron-Bridge's and Megatron-LM's recipes force-balance the router, NeMo
    # 25.04's drop and pad at capacity 1.0); a trained router on real data routes unevenly and every all-to-all and
    # grouped GEMM waits for the busiest rank (docs/planner.md §2; issue 12's sixtieth round)
    route_load: float = 1.0
    # multi-head latent attention (DeepSeek-V2/V3, Kimi K2): K and V (and Q, where q_lora > 0) come from low-rank
    # latents; `head_size` is then the no-position part of a Q/K head, `rope_dim` its rotary part, `v_head` V's width
    kv_lora: int = 0  # the K/V latent's rank (0: not MLA)
    q_lora: int = 0  # the Q latent's rank (0: Q projected from the hidden state directly)
    rope_dim: int = 0  # the rotary channels of each Q/K head (MLA), one K rotary part shared by the heads
    v_head: int | None = None  # V's channels per head (MLA; None: head_dim)
    # the layers of each pipeline chunk in model order (pp × virtual stages of them; the first also holds the
    # embedding, the last the output head and loss), as Megatron-Core's TransformerConfig sets them
    # (pipeline_model_parallel_layout, num_layers_in_first/last_pipeline_stage); (): the planner's balanced
    # partition (pipeline/partition.py).  `--pipeline-layout`; stage_layout.layout reads it
    pipeline_split: tuple[int, ...] = ()
    # without a `pipeline_split`: how the layers are cut into chunks -- "balanced" (par3d's own partition, by cost:
    # pipeline/partition.py) or "megatron" (Megatron-Core's default, which Megatron-LM, NeMo and Megatron-Bridge runs
    # use: `megatron_split`; the balanced one where it has none)
    partition: str = "balanced"
    # chunked local attention (Llama 4's attention_chunk_size): each token attends to the earlier tokens of its own
    # chunk of this many (a block-diagonal causal mask), so a sequence past the chunk costs the layer chunk-length
    # attention, not the whole sequence's (`attention_spans`); 0: none
    attn_chunk: int = 0
    # with attn_chunk: one layer in this many attends over the whole sequence (Llama 4's NoPE layers: config.json's
    # no_rope_layers, every 4th; layer u, counted from 1, when u % global_every == 0); 0: every layer chunked
    global_every: int = 0
    # with global_every K: the global layers are the first and every K-th after it (layer u, from 0, when u % K == 0:
    # CWM's, Granite's windowed models', ModernBERT's decoder's) rather than the K-th, 2K-th, ... (Gemma's, Llama 4's):
    # ceil(layers / K) of them, not floor
    global_first: bool = False
    # sliding-window attention on every layer (Mistral 7B v0.1's sliding_window, Phi-3's): each token attends to itself
    # and the window - 1 tokens before it (`attention_spans`); 0: none
    window: int = 0
    # a norm of head_dim channels on every query head and every key head after the QKV projection (Qwen3's q_norm /
    # k_norm; Megatron-Core's qk_layernorm): its fused kernels' traffic (compute.elementwise_bytes; its saved input is
    # not counted as new memory: memory.layer_activation_bytes says why).  MLA models' latent norms are priced apart
    # (`kv_lora`); not applied to them
    qk_norm: bool = False

    def __hash__(self) -> int:
        # the planner's caches key on the model thousands of times a search
        return fields_hash(self)

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def global_layers(self) -> int:
        """How many layers attend over the whole sequence beside the chunked or windowed ones (`global_every`,
        `global_first`); 0 without them."""
        k = self.global_every
        if not k:
            return 0
        return -(-self.layers // k) if self.global_first else self.layers // k

    def attention_spans(self) -> tuple[tuple[float, float, int], ...]:
        """The layers' attention, kind by kind: (share of the layers, the kind's score-matrix work against full causal
        attention over the sequence, the span its kernel works over).  Full causal attention: (1, 1, seq).  Chunked
        attention (`attn_chunk` c < seq): a query attends to its own chunk's earlier tokens, q·c(c+1)/2 + r(r+1)/2
        pairs of the s(s+1)/2 causal ones (s = q·c + r), and the fused kernel skips the masked-out tiles, so it works
        like a kernel over c-token sequences (its share of peak read at c, Device.attn_share); `global_every`'s
        layers attend over the whole sequence.  A sliding window (`window` w < seq): query i attends to min(i + 1, w)
        keys, the kernel read at w; on every layer, or on all but `global_every`'s."""
        s, c, w = self.seq_len, self.attn_chunk, self.window
        glob = self.global_layers / self.layers
        if w and s > w:  # query i attends to min(i + 1, w) keys: w(w + 1)/2 + (s - w)·w pairs, the kernel skipping
            # the tiles outside the band -- priced at its share for a w-token sequence (an assumption: no windowed
            # kernel is benchmarked here); `global_every`'s layers (Gemma 2/3's, OLMo 3's) attend over the whole
            band = (w * (w + 1) / 2 + (s - w) * w) / (s * (s + 1) / 2)
            return tuple(k for k in ((glob, 1.0, s), (1.0 - glob, band, w)) if k[0] > 0)
        if not c or s <= c:
            return ((1.0, 1.0, s),)
        q, r = divmod(s, c)
        band = (q * c * (c + 1) / 2 + r * (r + 1) / 2) / (s * (s + 1) / 2)
        return tuple(k for k in ((glob, 1.0, s), (1.0 - glob, band, c)) if k[0] > 0)

    @property
    def local_attention(self) -> bool:
        """Whether some layer attends to less than the causal whole of the sequence (chunks or a window past it)."""
        return any(work < 1.0 for _, work, _ in self.attention_spans())

    @property
    def attn_keys(self) -> int:
        """The keys each query's score GEMMs are sized by (`compute.layer_gemms`): the sequence, or under local
        attention (chunks, a window) the sequence times the layers' mean share of the causal work (`attention_spans`),
        so that the counted FLOPs are the work the layers do."""
        spans = self.attention_spans()
        if not self.local_attention:
            return self.seq_len
        return max(1, round(self.seq_len * sum(share * work for share, work, _ in spans)))

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def routed_copies(self) -> float:
        """Routed copies per token that the busiest expert-parallel rank computes, stores and exchanges: top_k under
        balanced routing, top_k × `route_load` otherwise (the router, the senders' permutation and the model FLOPs
        count top_k)."""
        return self.top_k * self.route_load

    def at_ep(self, ep: int) -> ModelSpec:
        """This model as a layout of `ep` expert-parallel ranks prices it: without expert parallelism every rank
        computes every copy (the total, whatever the routing: `balanced`), else as given."""
        return self if ep > 1 else self.balanced()

    def balanced(self) -> ModelSpec:
        """This model under balanced routing (itself when it is): what the FLOP counts (MFU's numerator) count -- the
        busiest rank's extra copies are waiting, not work.  Built once and kept on the instance (as `fields_hash`
        keeps the hash): the search asks for it ~10⁵ times, and one object keeps the pricing caches hitting."""
        if self.route_load == 1.0:
            return self
        b = self.__dict__.get("_balanced")
        if b is None:
            b = replace(self, route_load=1.0)
            object.__setattr__(self, "_balanced", b)
        return b

    def is_moe_layer(self, u: int) -> bool:
        """Whether layer u (1 .. layers) has the mixture of experts: past the leading `dense_layers`, every
        `moe_step`-th one."""
        return self.moe and u > self.dense_layers and (u - self.dense_layers) % self.moe_step == 0

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (`is_moe_layer`); 0 for a dense model."""
        return (self.layers - self.dense_layers) // self.moe_step if self.moe else 0

    @property
    def dense_count(self) -> int:
        """A mixture of experts' layers with a dense MLP (the leading ones and those `moe_step` interleaves); 0 for a
        dense model, whose layers are all its own kind."""
        return self.layers - self.moe_layers if self.moe else 0

    def dense_variant(self) -> ModelSpec:
        """The model's dense layer: its attention with a dense MLP of ffn_hidden (a MoE model's leading dense
        layers are priced as this model's layers).  Built once per model (a search asks for it ~10⁵ times)."""
        got = self.__dict__.get("_dense")
        if got is None:
            got = self._dense_variant()
            object.__setattr__(self, "_dense", got)
        return got

    def _dense_variant(self) -> ModelSpec:
        return replace(self, experts=0, top_k=0, moe_ffn_hidden=None, shared_ffn=0, dense_layers=0, moe_step=1,
                       mtp_layers=0)

    def mtp_params(self) -> int:
        """The multi-token-prediction modules' own parameters (their layer, projection and two norms; the embedding
        and the output head are the model's, shared)."""
        return self.mtp_layers * (self.layer_params() + 2 * self.hidden * self.hidden + 2 * self.norm_params)

    @property
    def expert_ffn(self) -> int:
        """One routed expert's intermediate width."""
        return self.moe_ffn_hidden if self.moe_ffn_hidden is not None else self.ffn

    @property
    def kv(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def head_dim(self) -> int:
        return self.head_size if self.head_size is not None else self.hidden // self.heads

    @property
    def mla(self) -> bool:
        return self.kv_lora > 0

    @property
    def qk_head(self) -> int:
        """One Q/K head's channels in the attention scores: head_dim (+ the rotary part under MLA)."""
        return self.head_dim + self.rope_dim

    @property
    def v_head_dim(self) -> int:
        return self.v_head if self.v_head is not None else self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of Q: heads × head_dim (× the Q/K head width under MLA); of the attention output and the output
        projection's input too, unless MLA gives V a width of its own (`o_dim`)."""
        return self.heads * self.qk_head

    @property
    def o_dim(self) -> int:
        """Width of the attention output, the output projection's input: heads × V's head width."""
        return self.heads * self.v_head_dim

    @property
    def kv_dim(self) -> int:
        """K's and V's mean width (2 × kv_dim = K + V): kv_heads × head_dim; MLA's heads × (Q/K + V heads) / 2."""
        if self.mla:
            return self.heads * (self.qk_head + self.v_head_dim) // 2
        return self.kv * self.head_dim

    def mla_replicated(self) -> int:
        """MLA's down projections and their latents' norms, which every TP rank holds whole (Megatron-Core's
        MLASelfAttention: linear_q_down_proj / linear_kv_down_proj are duplicated across TP)."""
        if not self.mla:
            return 0
        return self.hidden * (self.q_lora + self.kv_lora + self.rope_dim) + self.q_lora + self.kv_lora

    @property
    def norm_params(self) -> int:
        """One norm's parameters: LayerNorm weight + bias, RMSNorm weight."""
        return (2 if self.norm == "layer" else 1) * self.hidden

    def kv_heads_per_rank(self, tp: int) -> float:
        """K/V heads one TP rank holds: kv/tp when tp <= kv, else one (replicated, Megatron)."""
        return self.kv / tp if tp <= self.kv else 1.0

    def kv_dim_per_rank(self, tp: int) -> float:
        return self.kv_heads_per_rank(tp) * self.kv_dim / self.kv

    def _mlp_params(self, f: int) -> int:
        """One MLP of width f: its two or three matrices and their biases."""
        mats = (3 if self.gated else 2) * self.hidden * f
        return mats + ((f * (2 if self.gated else 1) + self.hidden) if self.bias else 0)

    def expert_layer_params(self) -> int:
        """One layer's routed experts (MoE; 0 for a dense layer): what expert parallelism splits."""
        return self.experts * self._mlp_params(self.expert_ffn) if self.moe else 0

    def dense_layer_params(self) -> int:
        """One layer's parameters other than the routed experts: attention, norms and the dense MLP, or (MoE) the
        router and the shared expert -- what TP splits."""
        h, q = self.hidden, self.q_dim
        if self.mla:  # down projections (+ latents' norms), Q's and K/V's up projections, the output projection
            q_up = self.q_lora * q if self.q_lora else h * q
            kv_up = self.kv_lora * self.heads * (self.head_dim + self.v_head_dim)
            attn = self.mla_replicated() + q_up + kv_up + self.o_dim * h
        else:
            attn = 2 * h * q + 2 * h * self.kv_dim + ((q + 2 * self.kv_dim + h) if self.bias else 0)
        if self.moe:
            mlp = h * self.experts + (self._mlp_params(self.shared_ffn) if self.shared_ffn else 0)
        else:
            mlp = self._mlp_params(self.ffn)
        return attn + mlp + 2 * self.norm_params

    def layer_params(self) -> int:
        return self.dense_layer_params() + self.expert_layer_params()

    def active_layer_params(self) -> int:
        """The parameters one token's forward uses in a layer: top_k of the routed experts (MoE)."""
        if not self.moe:
            return self.layer_params()
        return self.dense_layer_params() + self.top_k * self._mlp_params(self.expert_ffn)

    def layer_params_per_rank(self, tp: int, ep: int = 1) -> float:
        """One layer's parameters on one rank: 1/tp of its dense part, plus the replicated K/V heads when
        tp > kv_heads (each of the tp ranks holds one K/V head instead of kv/tp), plus E/ep whole routed
        experts (MoE)."""
        return self.dense_layer_params_per_rank(tp) + self.expert_layer_params() / ep

    def dense_layer_params_per_rank(self, tp: int) -> float:
        memo = self.__dict__.setdefault("_per_rank", {})  # a search asks for a few tp values ~10⁵ times
        got = memo.get(tp)
        if got is None:
            got = memo[tp] = self._dense_layer_params_per_rank(tp)
        return got

    def _dense_layer_params_per_rank(self, tp: int) -> float:
        extra_heads = max(tp - self.kv, 0)  # K/V heads stored beyond the model's kv over the group
        extra = extra_heads * 2 * self.head_dim * (self.hidden + (1 if self.bias else 0))
        replicated = self.mla_replicated()
        return (self.dense_layer_params() - replicated + extra) / tp + replicated

    def embedding_params(self) -> int:
        return self.vocab * self.hidden + (self.seq_len * self.hidden if self.learned_pos else 0)

    def head_params(self) -> int:
        """Output projection (+ final norm); counted on the last stage."""
        return self.vocab * self.hidden + self.norm_params

    def params(self) -> int:
        """Total trainable parameters (a tied head is counted once)."""
        head = self.norm_params if self.tied else self.head_params()
        dense = self.dense_count * self.dense_variant().layer_params() if self.dense_count else 0
        layers = self.moe_layers if self.moe else self.layers
        return layers * self.layer_params() + dense + self.embedding_params() + head + self.mtp_params()

    def active_params(self) -> int:
        """Parameters one token uses (MoE: top_k of the routed experts; a dense model's all of them)."""
        head = self.norm_params if self.tied else self.head_params()
        dense = self.dense_count * self.dense_variant().layer_params() if self.dense_count else 0
        mtp = self.mtp_layers * (self.active_layer_params() + 2 * self.hidden * self.hidden + 2 * self.norm_params)
        layers = self.moe_layers if self.moe else self.layers
        return layers * self.active_layer_params() + dense + self.embedding_params() + head + mtp

    def summary(self) -> str:
        extra = f", kv_heads={self.kv}" if self.kv != self.heads else ""
        if self.head_size is not None and self.q_dim != self.hidden:
            extra += f", head_dim={self.head_dim}"
        if self.mla:
            extra += (f", MLA (K/V latent {self.kv_lora}" + (f", Q latent {self.q_lora}" if self.q_lora else "")
                      + f", rope {self.rope_dim}, v {self.v_head_dim})")
        if self.moe:
            shared = f" + shared {self.shared_ffn}" if self.shared_ffn else ""
            dense = f", the first {self.dense_layers} layers dense (ffn {self.ffn})" if self.dense_layers else ""
            dense += (f", one layer in {self.moe_step} MoE ({self.moe_layers}; the others dense, ffn {self.ffn})"
                      if self.moe_step > 1 else "")
            dense += f", {self.mtp_layers} MTP module{'s' if self.mtp_layers > 1 else ''}" if self.mtp_layers else ""
            # what the plan assumes of the router (--moe-load; docs/planner.md §2 "Routing")
            dense += (f", the busiest EP rank at {self.route_load:g}x the balanced load" if self.route_load != 1.0
                      else ", balanced routing (--moe-load F for uneven)")
            mlp = f"{self.experts} experts of ffn {self.expert_ffn}, top-{self.top_k}{shared}{dense}"
            size = f"{self.params() / 1e9:.2f}B params ({self.active_params() / 1e9:.2f}B active)"
        else:
            mlp, size = f"ffn {self.ffn}", f"{self.params() / 1e9:.2f}B params"
        glob = (f" (one layer in {self.global_every} global{', from the first' if self.global_first else ''})"
                if self.global_every else "")
        if self.attn_chunk:
            extra += f", attention in chunks of {self.attn_chunk}" + glob
        if self.window:
            extra += f", sliding window {self.window}" + glob
        if self.qk_norm:
            extra += ", Q/K norms"
        return (f"{self.name}: {size}, {self.layers} layers, hidden {self.hidden}, "
                f"{self.heads} heads{extra}, {mlp}{' (gated)' if self.gated else ''}, "
                f"{'RMSNorm' if self.norm == 'rms' else 'LayerNorm'}, "
                f"{'learned' if self.learned_pos else 'rotary'} positions, "
                f"{'tied' if self.tied else 'untied'} embeddings, seq {self.seq_len}, vocab {self.vocab}")

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "params": self.params(), "layers": self.layers, "hidden": self.hidden,
                "heads": self.heads, "kv_heads": self.kv, "head_dim": self.head_dim, "seq_len": self.seq_len,
                "vocab": self.vocab,
                "ffn_hidden": self.ffn, "gated": self.gated, "norm": self.norm, "tied": self.tied,
                "position": "learned" if self.learned_pos else "rotary", "bias": self.bias,
                **({"experts": self.experts, "top_k": self.top_k, "moe_ffn_hidden": self.expert_ffn,
                    "shared_ffn": self.shared_ffn, "dense_layers": self.dense_layers, "moe_step": self.moe_step,
                    "mtp_layers": self.mtp_layers,
                    "active_params": self.active_params()} if self.moe else {}),
                **({"moe_load": self.route_load} if self.route_load != 1.0 else {}),
                **({"kv_lora_rank": self.kv_lora, "q_lora_rank": self.q_lora, "qk_rope_dim": self.rope_dim,
                    "v_head_dim": self.v_head_dim} if self.mla else {}),
                **({"pipeline_layout": list(self.pipeline_split)} if self.pipeline_split else {}),
                **({"attention_chunk": self.attn_chunk, "global_every": self.global_every} if self.attn_chunk else {}),
                **({"sliding_window": self.window} if self.window else {}),
                **({"global_every": self.global_every} if self.window and self.global_every else {}),
                **({"global_first": True} if self.global_every and self.global_first else {}),
                **({"qk_norm": True} if self.qk_norm else {})}


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    # GPT-3 paper (Brown et al. 2020) Table 2.1; seq 2048; vocab padded to 51200 as in Megatron-LM.
    return ModelSpec(name, layers, hidden, heads, 2048, 51200)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, seq, vocab, ffn, kv, gated=True, tied=False,
                     learned_pos=False, bias=False, norm="rms")


CATALOGUE: dict[str, ModelSpec] = {m.name: m for m in [
    _gpt3("gpt3-125m", 12, 768, 12),
    _gpt3("gpt3-350m", 24, 1024, 16),
    _gpt3("gpt3-760m", 24, 1536, 16),
    _gpt3("gpt3-1.3b", 24, 2048, 16),
    _gpt3("gpt3-2.7b", 32, 2560, 32),
    _gpt3("gpt3-6.7b", 32, 4096, 32),
    _gpt3("gpt3-13b", 40, 5120, 40),
    _gpt3("gpt3-175b", 96, 12288, 96),
    # Narayanan et al. 2021 (Megatron-LM, SC'21) Table 1's largest row: 1008B, seq 2048, vocab 51200
    _gpt3("megatron-1t", 128, 25600, 160),
    # Llama 2 (Touvron et al. 2023) and Llama 3 (Meta 2024) model cards / config.json
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
    # Llama 3.1 (Meta's model cards): the Llama 3 shapes; pre-trained at 8,192 tokens (128K only in the final
    # long-context stage: --seq-len sets it)
    _llama("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    _llama("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
    # the GPT-3-style runs of the validation set (validation.toml gives each source): BLOOM-176B (BigScience's
    # config.json: ALiBi, so no learned positions; LayerNorm with biases; tied embeddings), OPT-175B (Zhang et al. 2022
    # Table 1; its config.json's vocabulary), MT-NLG 530B (Smith et al. 2022 Table 1), NeMo's GPT-3 5B and 20B
    ModelSpec("bloom-176b", 70, 14336, 112, 2048, 250880, learned_pos=False),
    ModelSpec("opt-175b", 96, 12288, 96, 2048, 50272),
    ModelSpec("mt-nlg-530b", 105, 20480, 128, 2048, 51200),
    ModelSpec("gpt3-5b", 24, 4096, 32, 2048, 50304),
    ModelSpec("gpt3-20b", 44, 6144, 48, 2048, 50432),
    # Nemotron-4 15B and 340B (NVIDIA's technical reports, arXiv 2402.16819 and 2406.11704): squared-ReLU MLP,
    # LayerNorm without biases, GQA 8 K/V heads, rotary positions, untied 256K vocabulary, 4,096 tokens
    ModelSpec("nemotron4-15b", 32, 6144, 48, 4096, 256000, 24576, 8, tied=False, learned_pos=False, bias=False),
    ModelSpec("nemotron4-340b", 96, 18432, 96, 4096, 256000, 73728, 8, tied=False, learned_pos=False, bias=False),
    # mixtures of experts (their config.json files; the sequence as the NeMo / Megatron-Bridge recipes train them)
    # Mixtral 8x7B and 8x22B (Mistral AI): 8 experts, top-2; NeMo's MixtralConfig8x7B / 8x22B seq_length 4,096 / 65,536
    ModelSpec("mixtral-8x7b", 32, 4096, 32, 4096, 32000, 14336, 8, gated=True, tied=False, learned_pos=False,
              bias=False, norm="rms", experts=8, top_k=2),
    ModelSpec("mixtral-8x22b", 56, 6144, 48, 65536, 32768, 16384, 8, gated=True, tied=False, learned_pos=False,
              bias=False, norm="rms", experts=8, top_k=2),
    # Qwen3-30B-A3B and Qwen3-235B-A22B (Qwen's config.json; 4,096 tokens, the Qwen3 report's first pre-training
    # stage; their per-head Q/K norms: qk_norm)
    ModelSpec("qwen3-30b-a3b", 48, 2048, 32, 4096, 151936, 6144, 4, gated=True, tied=False, learned_pos=False,
              bias=False, norm="rms", head_size=128, experts=128, top_k=8, moe_ffn_hidden=768, qk_norm=True),
    ModelSpec("qwen3-235b-a22b", 94, 4096, 64, 4096, 151936, 12288, 4, gated=True, tied=False, learned_pos=False,
              bias=False, norm="rms", head_size=128, experts=128, top_k=8, moe_ffn_hidden=1536, qk_norm=True),
    # DeepSeek-V3 (arXiv 2412.19437 and its config.json: MLA, 3 leading dense layers, 256 routed experts of 2,048 in 8
    # groups (4 per token) + one shared, one multi-token-prediction module, pre-trained at 4K tokens) and Kimi K2
    # (Moonshot AI's config.json: its architecture with 64 heads, 384 experts, one leading dense layer, no MTP)
    ModelSpec("deepseek-v3", 61, 7168, 128, 4096, 129280, 18432, gated=True, tied=False, learned_pos=False,
              bias=False, norm="rms", head_size=128, experts=256, top_k=8, moe_ffn_hidden=2048, shared_ffn=2048,
              dense_layers=3, mtp_layers=1, route_groups=8, route_group_topk=4, kv_lora=512, q_lora=1536,
              rope_dim=64, v_head=128),
    ModelSpec("kimi-k2", 61, 7168, 64, 4096, 163840, 18432, gated=True, tied=False, learned_pos=False,
              bias=False, norm="rms", head_size=128, experts=384, top_k=8, moe_ffn_hidden=2048, shared_ffn=2048,
              dense_layers=1, kv_lora=512, q_lora=1536, rope_dim=64, v_head=128),
    # Llama 4 Scout and Maverick (Meta's config.json text_config: 16 / 128 experts of 8,192, top-1, one shared expert
    # of 8,192; Maverick one layer in two MoE, the others dense of 16,384; 8,192-token attention chunks on three layers
    # in four, the fourth global (HF's no_rope_layers / nope_layer_interval 4); 8,192 tokens by default, --seq-len
    # for longer; Scout's L2 norm on Q and K, priced on every layer as Megatron-Core's qk_l2_norm runs it (NeMo's
    # Llama4Experts16Config; HF's use_qk_norm, which its RoPE layers alone apply), Maverick has none (its config's
    # use_qk_norm false, NeMo's Llama4Experts128Config qk_l2_norm False)): 109B / 400B parameters, 17B active (model cards)
    ModelSpec("llama4-scout", 48, 5120, 40, 8192, 202048, 16384, 8, gated=True, tied=False, learned_pos=False,
              bias=False, norm="rms", experts=16, top_k=1, moe_ffn_hidden=8192, shared_ffn=8192, attn_chunk=8192,
              global_every=4, qk_norm=True),
    ModelSpec("llama4-maverick", 48, 5120, 40, 8192, 202048, 16384, 8, gated=True, tied=False, learned_pos=False,
              bias=False, norm="rms", experts=128, top_k=1, moe_ffn_hidden=8192, shared_ffn=8192, moe_step=2,
              attn_chunk=8192, global_every=4),
    # the seed's §4.2/§4.5 model: 96 layers, H=4096 (≈19B in its layers), micro-batch 8 x seq 1024
    ModelSpec("seed-96l", 96, 4096, 32, 1024, 51200),
]}


# catalogue models whose block par3d's runtime cannot build as it is (config.model_config_from_spec refuses them, as
# it refuses mixtures of experts and multi-head latent attention): what the runtime lacks
RUNTIME_LACKS = {"bloom-176b": "ALiBi positions", "nemotron4-15b": "squared-ReLU MLP",
                 "nemotron4-340b": "squared-ReLU MLP"}


# Hugging Face model types with a gated MLP whatever their activation's name (Gemma's GeGLU: gelu_pytorch_tanh) or
# that leave it implicit, and those that tie the output head to the embedding when config.json omits the key
# (every Gemma model type -- gemma, gemma2, gemma3_text, vaultgemma, ... -- is a GeGLU with tied embeddings: GEMMA_TYPES)
# BitNet: ReLU² gated; ModernBERT's decoder: GeGLU (its Wi projects to twice intermediate_size, then splits in two)
GATED_TYPES = ("llama", "mistral", "qwen2", "bitnet", "modernbert-decoder")
GEMMA_TYPES = ("gemma", "vaultgemma")  # model-type prefixes
# Hugging Face model types whose attention normalises Q and K after their projections (the modeling files' q_norm /
# k_norm: per head in Qwen3, Qwen3-MoE and Gemma 3, over the whole projection in OLMo 2 and OLMoE -- the same bytes);
# Llama 4's config says so itself (`use_qk_norm`: Scout's L2 norm)
QK_NORM_TYPES = ("qwen3", "qwen3_moe", "gemma3_text", "gemma3", "olmo2", "olmoe")


def model_names() -> list[str]:
    return sorted(CATALOGUE)


def from_hf_config(path: str) -> ModelSpec:
    """Read a Hugging Face `config.json` (GPT-2/GPT-NeoX/OPT/BLOOM/Llama/Mistral/Qwen/Gemma/Falcon/MPT/GPT-BigCode key
    names)."""
    try:
        with open(path) as fh:
            cfg = json.load(fh)
    except (OSError, ValueError) as e:
        raise ModelError(f"--model {path}: cannot read a JSON config ({e}); give a Hugging Face "
                         f"config.json or a catalogue name ({', '.join(model_names())})") from e
    if not isinstance(cfg, dict):
        raise ModelError(f"--model {path}: the JSON is a {type(cfg).__name__}, not an object of a model's settings; give "
                         f"a Hugging Face config.json or a catalogue name ({', '.join(model_names())})")
    if isinstance(cfg.get("text_config"), dict):  # a multimodal checkpoint (Llama 4): the language model's own config
        cfg = {**cfg["text_config"], "_name_or_path": cfg.get("_name_or_path") or cfg.get("model_type")}
    cfg = _ernie_keys(_dbrx_keys(_llama4_keys(cfg, path)), path)

    def pick(*keys: str, default: int | None = None) -> int | None:
        for k in keys:
            if isinstance(cfg.get(k), int):
                return cfg[k]
        return default

    layers = pick("num_hidden_layers", "n_layer", "num_layers", "n_layers")  # n_layers, n_heads, max_seq_len: MPT's
    hidden = pick("hidden_size", "n_embd", "d_model")
    heads = pick("num_attention_heads", "n_head", "n_heads")
    vocab = pick("vocab_size")
    seq = pick("max_position_embeddings", "n_positions", "n_ctx", "seq_length", "max_seq_len", default=2048)
    chunk = cfg.get("_attention_chunk")
    chunk = chunk if isinstance(chunk, int) and chunk > 0 else 0
    if chunk and seq and seq > chunk:  # Llama 4's 10M-token positions: its chunk as the default length (--seq-len
        seq = chunk  # sets a longer one, priced with the chunks: ModelSpec.attention_spans)
    # what the planner cannot price is named first: a Mamba or RWKV config lacks heads, but that is not why
    _refuse_windows(cfg, path)
    _refuse_state_space(cfg, path)
    _refuse_unpriced(cfg, path)
    _refuse_layer_kinds(cfg, path)
    missing = [n for n, v in (("layers", layers), ("hidden", hidden), ("heads", heads), ("vocab", vocab))
               if v is None]
    if missing:
        raise ModelError(f"--model {path}: config.json lacks {', '.join(missing)}; pass them with "
                         f"{' '.join('--' + m for m in missing)}")
    moe = {**_moe_of(cfg, path), **_mla_of(cfg)}
    kind = cfg.get("model_type")
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "gelu")))
    gemma = str(kind).startswith(GEMMA_TYPES)  # every Gemma is a GeGLU with tied embeddings
    gated = act in ("silu", "swiglu", "swish") or kind in GATED_TYPES or gemma
    rms = "rms_norm_eps" in cfg or kind in ("llama", "mistral", "qwen2")
    ffn = pick("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")
    if ffn is None and isinstance(cfg.get("expansion_ratio"), (int, float)):  # MPT: the MLP's width over d_model
        ffn = int(cfg["expansion_ratio"] * hidden)
    # biases: Falcon's `bias`, MPT's `no_bias`; otherwise GPT-style models have them and gated (Llama-style) ones not
    bias = (cfg["bias"] if isinstance(cfg.get("bias"), bool)
            else not cfg["no_bias"] if isinstance(cfg.get("no_bias"), bool) else not gated)
    name = str(cfg.get("_name_or_path") or kind or os.path.basename(os.path.dirname(path)) or path)
    return ModelSpec(name, int(layers), int(hidden), int(heads), int(seq), int(vocab), ffn,  # type: ignore[arg-type]
                     None if "kv_lora" in moe else _kv_heads_of(cfg, heads), gated=gated,
                     tied=bool(cfg.get("tie_word_embeddings", not gated or gemma)),
                     learned_pos=kind in ("gpt2", "opt", "gpt_neo", "gpt_bigcode"), bias=bias,
                     norm="rms" if rms else "layer", attn_chunk=chunk,
                     **_global_fields(cfg, path, chunk),
                     window=_window_of(cfg, path, layers),
                     qk_norm=(cfg.get("model_type") in QK_NORM_TYPES or cfg.get("use_qk_norm") is True)
                     and "kv_lora" not in moe,
                     **{"head_size": _head_size(cfg), **moe})


def _llama4_keys(cfg: dict, path: str) -> dict:
    """Llama 4's text config in the key names `from_hf_config` reads: its experts' (and shared expert's) width is
    `intermediate_size`, its dense layers' `intermediate_size_mlp`, its interleaving `interleave_moe_layer_step`; its
    chunked attention (`attention_chunk_size`) runs on the layers `no_rope_layers` marks 1 (or `layer_types` calls
    "chunked_attention"), the others attending globally: every `nope_layer_interval`-th (4) where neither is given,
    as transformers' Llama4TextConfig fills them."""
    if cfg.get("model_type") not in ("llama4_text", "llama4"):
        return cfg
    out = dict(cfg)
    if isinstance(cfg.get("intermediate_size"), int):
        out["moe_intermediate_size"] = cfg["intermediate_size"]
        out["shared_expert_intermediate_size"] = cfg["intermediate_size"]  # one shared expert of the experts' width
    if isinstance(cfg.get("intermediate_size_mlp"), int):
        out["intermediate_size"] = cfg["intermediate_size_mlp"]
    out["hidden_act"] = cfg.get("hidden_act", "silu")
    out["_attention_chunk"] = cfg.get("attention_chunk_size")
    n = cfg.get("num_hidden_layers")
    kinds = cfg.get("layer_types")
    rope = cfg.get("no_rope_layers")
    if isinstance(kinds, list) and kinds:
        glob = [i for i, k in enumerate(kinds) if k != "chunked_attention"]
    elif isinstance(rope, list) and rope:
        glob = [i for i, k in enumerate(rope) if not k]
    else:
        every = cfg.get("nope_layer_interval", 4)
        glob = [i for i in range(n if isinstance(n, int) else 0) if isinstance(every, int) and every > 0
                and (i + 1) % every == 0]
    if glob:
        out["_global_every"], out["_global_first"] = _global_period(glob, n, path, "global-attention",
                                                                    "the chunked ones")
    return out


def _global_fields(cfg: dict, path: str, chunk: int) -> dict[str, object]:
    """`global_every` and `global_first` of a config.json: Llama 4's read with its chunks (`_llama4_keys`), the others'
    beside their windows (`_window_global_every`)."""
    if chunk:
        return {"global_every": int(cfg.get("_global_every", 0)), "global_first": bool(cfg.get("_global_first"))}
    every, first = _window_global_every(cfg, path)
    return {"global_every": every, "global_first": first}


def _global_period(glob: list[int], layers: object, path: str, kind: str, beside: str) -> tuple[int, bool]:
    """(K, first) where the 0-based layers `glob` are every K-th of `layers`: the K-th, 2K-th, ... (layer u, from 1, when
    u % K == 0; Llama 4's, Gemma's) or, `first`, the first and every K-th after it (u, from 0, when u % K == 0; CWM's,
    Granite's windowed models', ModernBERT's decoder's).  The planner prices the global layers by their count
    (`ModelSpec.global_layers`), so these two placements are the ones it reads; others are refused by name."""
    if isinstance(layers, int):
        every = glob[0] + 1
        if glob == [i for i in range(layers) if (i + 1) % every == 0]:
            return every, False
        every = glob[1] if len(glob) > 1 else layers
        if glob[0] == 0 and every > 1 and glob == [i for i in range(layers) if i % every == 0]:
            return every, True
    raise ModelError(f"--model {path}: its {kind} layers (0-based {glob[:8]}{' ...' if len(glob) > 8 else ''}) are "
                     f"not every k-th layer, from the k-th or from the first: the patterns the planner prices beside "
                     f"{beside}")


def _dbrx_keys(cfg: dict) -> dict:
    """DBRX's config.json nests its MLP and attention keys (`ffn_config`, `attn_config`): read flat, its MLP is a
    mixture of `moe_num_experts` GLU experts of `ffn_hidden_size`, `moe_top_k` a token, its K/V heads
    `attn_config.kv_n_heads` (transformers' DbrxConfig).  Unread, the model would be priced as a dense MHA
    transformer of a seventh of its parameters."""
    ffn, attn = cfg.get("ffn_config"), cfg.get("attn_config")
    if not isinstance(ffn, dict) and not isinstance(attn, dict):
        return cfg
    out = dict(cfg)
    if isinstance(ffn, dict):
        for src, dst in (("moe_num_experts", "moe_num_experts"), ("moe_top_k", "moe_top_k"),
                         ("ffn_hidden_size", "moe_intermediate_size")):
            if isinstance(ffn.get(src), int) and dst not in cfg:
                out[dst] = ffn[src]
        act = ffn.get("ffn_act_fn")
        name = act.get("name") if isinstance(act, dict) else act
        if isinstance(name, str) and "hidden_act" not in cfg:
            out["hidden_act"] = name
    if isinstance(attn, dict) and isinstance(attn.get("kv_n_heads"), int):
        out["num_key_value_heads"] = attn["kv_n_heads"]
    return out


def _ernie_keys(cfg: dict, path: str) -> dict:
    """ERNIE 4.5's mixture of experts in the key names `_moe_of` reads: top-k `moe_k` (its shared experts,
    `moe_num_shared_experts`, `_moe_of` reads as Aria's); its MoE layers are those from `moe_layer_start_index` to
    `moe_layer_end_index` every `moe_layer_interval`-th (transformers' Ernie4_5_MoeConfig), which the planner prices
    as leading dense layers then all MoE: other placements are refused, naming the key."""
    if not any(k in cfg for k in ("moe_k", "moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval")):
        return cfg
    out = dict(cfg)
    if isinstance(cfg.get("moe_k"), int):
        out.setdefault("num_experts_per_tok", cfg["moe_k"])
    layers = cfg.get("num_hidden_layers")
    start, end = cfg.get("moe_layer_start_index", 0), cfg.get("moe_layer_end_index", -1)
    interval = cfg.get("moe_layer_interval", 1)
    if isinstance(end, int) and end < 0 and isinstance(layers, int):
        end = layers + end
    if interval not in (1, None) or (isinstance(layers, int) and isinstance(end, int) and end < layers - 1):
        raise ModelError(f"--model {path}: config.json's MoE layers (moe_layer_start_index {start}, moe_layer_end_index "
                         f"{cfg.get('moe_layer_end_index')}, moe_layer_interval {interval} of {layers} layers) are not "
                         "leading dense layers then all MoE, the one mix the planner prices: describe the nearest "
                         "model with flags (--dense-layers, --moe-step) to bound it")
    if isinstance(start, int) and start > 0:
        out.setdefault("first_k_dense_replace", start)
    return out


def _kv_heads_of(cfg: dict, heads: int | None) -> int | None:
    """K/V heads from a config.json: `num_key_value_heads` (Llama, Mistral, Qwen, Gemma), Falcon's `num_kv_heads` (its
    new decoder architecture) or multi-query attention, one K/V head (Falcon-7B's `multi_query`, FalconConfig's
    default; GPT-BigCode's, StarCoder's); None: one per query head."""
    for k in ("num_key_value_heads", "num_kv_heads", "n_head_kv"):
        if isinstance(cfg.get(k), int) and (cfg.get("model_type") != "falcon" or cfg.get("new_decoder_architecture")):
            return cfg[k]
    if cfg.get("model_type") == "falcon" and not cfg.get("new_decoder_architecture"):
        return 1 if cfg.get("multi_query", True) else heads
    return 1 if cfg.get("multi_query") is True else None


def _head_size(cfg: dict) -> int | None:
    """config.json's `head_dim` (Gemma, Qwen3-32B, Mistral NeMo); `resolve_model` drops it where it equals
    hidden / heads."""
    hd = cfg.get("head_dim")
    return hd if isinstance(hd, int) else None


# config.json keys that give a model's routed-expert count (Mixtral, Qwen-MoE / OLMoE, DeepSeek V2/V3, DBRX)
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# ... the experts each token runs, and one expert's width where it is not `intermediate_size` (Mixtral, OLMoE)
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_top_k", "moe_topk")
EXPERT_WIDTH_KEYS = ("moe_intermediate_size", "expert_intermediate_size")
# ... and a count of always-on shared experts of that width
SHARED_COUNT_KEYS = ("n_shared_experts", "moe_num_shared_experts", "num_shared_experts", "num_shared_expert")


def _per_layer_scalars(cfg: dict, path: str) -> dict:
    """A mixture of experts' keys given per layer (Hunyuan's `moe_topk`, `moe_intermediate_size`,
    `num_shared_expert`: one entry a layer) read as one value where every layer has the same; refused, naming the key,
    where they differ (the planner prices one kind of MoE layer).  Lists of another length are left to `_moe_of`."""
    layers = cfg.get("num_hidden_layers")
    out = dict(cfg)
    for k in EXPERT_KEYS + TOP_K_KEYS + EXPERT_WIDTH_KEYS + SHARED_COUNT_KEYS:
        v = cfg.get(k)
        if isinstance(v, list) and v and len(v) == layers and all(isinstance(x, int) for x in v):
            if len(set(v)) > 1:
                raise ModelError(f"--model {path}: config.json's {k} differs by layer ({sorted(set(v))}); the planner "
                                 "prices one kind of MoE layer: describe the nearest model with flags to bound it")
            out[k] = v[0]
    return out
# keys that put dense layers among the MoE ones, and the value that means "none"
MIXED_LAYER_KEYS = {"mlp_only_layers": [], "moe_layer_freq": 1}
# ... and the keys that interleave them regularly, which are read (ModelSpec.moe_step): Llama 4's, Qwen2-MoE's
STEP_KEYS = ("interleave_moe_layer_step", "decoder_sparse_step")


def _window_of(cfg: dict, path: str, layers: int) -> int:
    """A sliding window on every layer (`sliding_window`: Mistral 7B v0.1's 4,096, Phi-3's 2,047), or 0: none where it
    is null or `use_sliding_window` is false (Qwen2/Qwen3 ship a window they do not use).  Qwen2's `max_window_layers`,
    windowing only some layers, is refused by name."""
    w = cfg.get("sliding_window")
    if not isinstance(w, int) or w <= 0 or cfg.get("use_sliding_window") is False:
        return 0
    mwl = cfg.get("max_window_layers")
    if cfg.get("use_sliding_window") is True and isinstance(mwl, int) and mwl < layers:
        raise ModelError(f"--model {path}: config.json windows only some layers (use_sliding_window with "
                         f"max_window_layers {mwl} of {layers}); the planner prices one kind of window per model")
    return w


# config.json keys and model types of state-space (Mamba) and hybrid models: Nemotron-H / Nemotron 3
# (hybrid_override_pattern), Jamba (attn_layer_period), Falcon-H1, Granite 4 hybrids, Mamba / Mamba-2 themselves
STATE_SPACE_KEYS = ("hybrid_override_pattern", "hybrid_layer_pattern", "layers_block_type", "attn_layer_period",
                    "mamba_d_state", "mamba_n_heads", "mamba_num_heads", "ssm_cfg")
STATE_SPACE_TYPES = ("mamba", "mamba2", "nemotron_h", "jamba", "falcon_h1", "falcon_mamba", "granitemoehybrid", "zamba",
                     "zamba2", "bamba", "rwkv", "xlstm", "recurrent_gemma")  # (the last three recurrent: RWKV, xLSTM, Griffin)


def _refuse_state_space(cfg: dict, path: str) -> None:
    """Refuse state-space layers (Mamba, Mamba-2) and hybrids of them with attention: the planner would read such a
    config as a transformer of as many attention layers.  A Mamba-2 pricing was tried against Megatron-Bridge's 20
    Nemotron 3 Nano runs and missed every one, +16 ... +47 % (docs/planner.md section 9, twenty-ninth round)."""
    kinds = cfg.get("layer_types")
    blocks = cfg.get("block_types")  # RecurrentGemma's (Griffin's) "recurrent" / "attention" blocks
    key = next((k for k in STATE_SPACE_KEYS if k in cfg), None)
    if key is None and isinstance(blocks, list) and any(b != "attention" for b in blocks):
        key = "block_types"
    mtype = str(cfg.get("model_type", ""))
    if key or mtype in STATE_SPACE_TYPES or (isinstance(kinds, list) and any("mamba" in str(k) for k in kinds)):
        why = f"key {key!r}" if key else f"model_type {mtype!r}" if mtype in STATE_SPACE_TYPES else "layer_types"
        raise ModelError(f"--model {path}: config.json describes state-space or recurrent (Mamba, RWKV, xLSTM, "
                         f"Griffin) layers ({why}); the planner "
                         "prices transformer layers only, and its one pricing of a hybrid Mamba model missed every "
                         "published run it was checked against (docs/planner.md section 9): no plan is offered for it")


# config.json keys of layers the planner does not price, and what each is: the first found is named in the refusal
UNPRICED_KEYS = {
    "index_topk": "sparse attention over indexer-selected tokens (DeepSeek-V3.2's and V4's DSA)",
    "compress_ratios": "compressed sparse attention (DeepSeek-V4)",
    "compress_rates": "compressed sparse attention (DeepSeek-V4)",
    "hc_mult": "hyper-connections: several residual streams mixed per layer (DeepSeek-V4's mHC)",
    "num_hash_layers": "hash-routed MoE layers (DeepSeek-V4)",
    "zero_expert_num": "zero-computation experts in shortcut-connected MoE layers (LongCat-Flash)",
    "hidden_size_per_layer_input": "per-layer input embeddings (Gemma 3n's and Gemma 4's)",
}


# ... and model types whose layers are of their own kind where no key says so
UNPRICED_TYPES = {"jetmoe": "attention experts (JetMoE's mixture of attention heads)",
                  "hrm_text": "a hierarchical reasoning model's recurrent modules (HRM)"}


def _refuse_unpriced(cfg: dict, path: str) -> None:
    """Refuse a config.json whose layers do something the planner's transformer layer does not (`UNPRICED_KEYS`): read
    by its other keys it would be priced as a DeepSeek-V3-style model of dense MLA attention, which such a layer is
    not.  Describe the nearest model with flags to bound it."""
    mtype = str(cfg.get("model_type", ""))
    if mtype in UNPRICED_TYPES:
        raise ModelError(f"--model {path}: config.json's model_type {mtype!r} describes {UNPRICED_TYPES[mtype]}, which "
                         "the planner does not price: no plan is offered for it; describe the nearest model with flags "
                         "to bound it")
    key = next((k for k in UNPRICED_KEYS if cfg.get(k) not in (None, 0, 1, [], False)), None)
    if key:
        raise ModelError(f"--model {path}: config.json's {key} = {cfg[key]!r} describes {UNPRICED_KEYS[key]}, which "
                         "the planner does not price (its layers are dense or MLA attention and a routed or dense "
                         "MLP): no plan is offered for it; describe the nearest model with flags to bound it")


# the kinds of `layer_types` entries the planner prices as its attention layer (Llama 4's chunked layers are read by
# `_llama4_keys`; sliding-window layers are refused by `_refuse_windows`, state-space ones by `_refuse_state_space`)
ATTENTION_KINDS = ("full_attention", "attention", "global_attention", "chunked_attention", "sliding_attention")
LAYER_KIND_WORDS = {"linear_attention": "linear attention (Qwen3-Next's Gated DeltaNet, MiniMax's lightning attention, "
                                        "Kimi Linear)",
                    "conv": "short convolutions (LFM2)", "indexed_attention": "indexer-selected sparse attention",
                    "compressed_sparse_attention": "compressed sparse attention"}


def _refuse_layer_kinds(cfg: dict, path: str) -> None:
    """Refuse a config.json whose `layer_types` names layers other than softmax attention (linear attention,
    convolutions, sparse attention, ...): read by its other keys such a model would be priced as a transformer of as
    many full-attention layers, which it is not, with no published run to bound the difference."""
    kinds = cfg.get("layer_types")
    if not isinstance(kinds, list):
        return
    other = sorted({str(k) for k in kinds if k not in ATTENTION_KINDS})
    if other:
        said = "; ".join(f"{kinds.count(k)} layers of kind {k!r}" + (f", {LAYER_KIND_WORDS[k]}" if k in LAYER_KIND_WORDS
                                                                        else "") for k in other)
        raise ModelError(f"--model {path}: config.json's layer_types has {said}; the planner prices softmax-attention "
                         "transformer layers only, so no plan is offered for it: describe the nearest transformer with "
                         "flags to bound it")


def _refuse_windows(cfg: dict, path: str) -> None:
    """Refuse GPT-OSS: tried with its windows priced, it ran slower than predicted in every published run it was
    checked against, by what its attention sinks and clamped GLU experts run on, which the planner does not know
    (docs/planner.md section 9, twenty-third round).  Other models' sliding-window layers are read
    (`_window_global_every`)."""
    if cfg.get("model_type") == "gpt_oss":
        kinds = cfg.get("layer_types")
        n = kinds.count("sliding_attention") if isinstance(kinds, list) else "its"
        raise ModelError(f"--model {path}: GPT-OSS (model_type 'gpt_oss': {n} sliding-window layers of "
                         f"{cfg.get('sliding_window')} tokens, attention sinks, clamped GLU experts): no pricing of it "
                         "was met by its published runs (docs/planner.md section 9): no plan is offered for it")


# config.json keys giving the period of a model's global layers among its sliding-window ones where no layer_types
# lists them: Gemma 3's and Cohere 2's `sliding_window_pattern`; Gemma 2 alternates (every second layer global)
WINDOW_PATTERN_KEYS = ("sliding_window_pattern",)


def _window_global_every(cfg: dict, path: str) -> tuple[int, bool]:
    """The global layers among sliding-window ones, as one in K and whether the first is one (`ModelSpec.global_every`,
    `global_first`; 0: every layer windowed, or no window): from `layer_types` (Gemma 2/3, OLMo 3, Cohere 2:
    "full_attention" every K-th layer, the others "sliding_attention"; CWM, Granite's windowed models, ModernBERT's
    decoder: the first and every K-th after it), else `sliding_window_pattern`, else Gemma 2's alternation.  Other
    placements are refused, naming the layers."""
    kinds = cfg.get("layer_types")
    if isinstance(kinds, list) and "sliding_attention" in kinds:
        glob = [i for i, k in enumerate(kinds) if k != "sliding_attention"]
        return _global_period(glob, len(kinds), path, "full-attention", "sliding-window ones") if glob else (0, False)
    if not isinstance(cfg.get("sliding_window"), int) or cfg.get("use_sliding_window") is False:
        return 0, False
    pattern = next((cfg[k] for k in WINDOW_PATTERN_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 1), None)
    if pattern is not None:
        return pattern, False
    return (2 if cfg.get("model_type") == "gemma2" else 0), False


def _moe_of(cfg: dict, path: str) -> dict[str, int]:
    """The mixture-of-experts fields of a config.json ({} for a dense model): experts, top-k, one expert's width
    (`moe_intermediate_size`, else `intermediate_size`: Mixtral's and OLMoE's configs give the expert's width
    there), the shared expert's width (Qwen2-MoE's `shared_expert_intermediate_size`; DeepSeek's
    `n_shared_experts` × the expert width), DeepSeek's leading dense layers (`first_k_dense_replace`, of
    `intermediate_size`).  Refused, naming the key: dense layers mixed elsewhere among the MoE ones (priced as
    uniform they would be mispriced).  Multi-head latent attention is read apart (`_mla_of`)."""
    cfg = _per_layer_scalars(cfg, path)
    several = next((k for k in EXPERT_KEYS + EXPERT_WIDTH_KEYS if isinstance(cfg.get(k), list)), None)
    if several is not None:  # ERNIE 4.5-VL's text and vision experts: one list entry per modality
        raise ModelError(f"--model {path}: config.json's {several} = {cfg[several]!r} describes experts of several "
                         "kinds (one per modality); the planner prices one kind of routed expert: describe the text "
                         "model with --experts/--top-k/--moe-ffn-hidden to bound it")
    experts = next((cfg[k] for k in EXPERT_KEYS if isinstance(cfg.get(k), int) and cfg[k] > 1), None)
    if experts is None or cfg.get("is_moe") is False:  # Doge's config carries an expert count with is_moe false
        return {}
    top_k = next((cfg[k] for k in TOP_K_KEYS if isinstance(cfg.get(k), int)), None)
    if top_k is None or not 1 <= top_k <= experts:
        raise ModelError(f"--model {path}: a mixture of {experts} experts without a top-k in 1..{experts} "
                         f"(one of {', '.join(TOP_K_KEYS)}); pass a config.json that has it, or describe the "
                         "model with --experts/--top-k/--moe-ffn-hidden")
    for k, none in MIXED_LAYER_KEYS.items():
        if k in cfg and cfg[k] not in (none, None):
            raise ModelError(f"--model {path}: config.json's {k} = {cfg[k]!r} mixes dense layers among the MoE "
                             "ones; the planner prices every layer alike (all MoE), which would count the dense "
                             "layers' MLPs as experts: describe an all-MoE model with flags to bound it")
    width = next((cfg[k] for k in EXPERT_WIDTH_KEYS if isinstance(cfg.get(k), int)), None)
    shared = cfg.get("shared_expert_intermediate_size")
    if not isinstance(shared, int):  # a count of shared experts (DeepSeek's, Aria's, ERNIE 4.5's key) of the experts' width
        n_shared = next((cfg[k] for k in SHARED_COUNT_KEYS if isinstance(cfg.get(k), int)), None)
        each = width if width is not None else cfg.get("intermediate_size")
        shared = n_shared * each if isinstance(n_shared, int) and isinstance(each, int) else 0
    out = {"experts": experts, "top_k": top_k, "shared_ffn": shared}
    if width is not None:
        out["moe_ffn_hidden"] = width
    k = cfg.get("first_k_dense_replace")
    if isinstance(k, int) and k > 0:
        out["dense_layers"] = k
    step = next((cfg[k] for k in STEP_KEYS if isinstance(cfg.get(k), int)), 1)
    if step > 1:
        out["moe_step"] = step
    mtp = cfg.get("num_nextn_predict_layers")
    if isinstance(mtp, int) and mtp > 0:
        out["mtp_layers"] = mtp
    groups, topk = cfg.get("n_group"), cfg.get("topk_group")
    if isinstance(groups, int) and isinstance(topk, int) and 1 <= topk < groups:
        out["route_groups"], out["route_group_topk"] = groups, topk
    return out


def _mla_of(cfg: dict) -> dict[str, int]:
    """Multi-head latent attention's fields of a config.json (DeepSeek-V2/V3, Kimi K2: `kv_lora_rank`,
    `q_lora_rank` -- null for none --, `qk_nope_head_dim` as the heads' no-position width, `qk_rope_head_dim`,
    `v_head_dim`); {} otherwise.  MLA is multi-head: one K/V per query head."""
    r = cfg.get("kv_lora_rank")
    if not isinstance(r, int) or r < 1:
        return {}
    q = cfg.get("q_lora_rank")
    out = {"kv_lora": r, "q_lora": q if isinstance(q, int) else 0,
           "rope_dim": int(cfg.get("qk_rope_head_dim") or 0)}
    if isinstance(cfg.get("qk_nope_head_dim"), int):
        out["head_size"] = cfg["qk_nope_head_dim"]
    if isinstance(cfg.get("v_head_dim"), int):
        out["v_head"] = cfg["v_head_dim"]
    return out


def is_config_path(name: str) -> bool:
    """Whether `--model NAME` names a config.json (or its folder) rather than a catalogue model."""
    return name.lower() not in CATALOGUE and os.path.exists(name)


NORMS = ("layer", "rms")
POSITIONS = ("learned", "rotary")


def resolve_model(name: str | None, layers: int | None = None, hidden: int | None = None,
                  heads: int | None = None, seq_len: int | None = None, vocab: int | None = None,
                  ffn_hidden: int | None = None, kv_heads: int | None = None, gated: bool | None = None,
                  norm: str | None = None, tied: bool | None = None, position: str | None = None,
                  bias: bool | None = None, head_dim: int | None = None, experts: int | None = None,
                  top_k: int | None = None, moe_ffn_hidden: int | None = None,
                  shared_ffn: int | None = None, dense_layers: int | None = None, kv_lora: int | None = None,
                  q_lora: int | None = None, rope_dim: int | None = None, v_head: int | None = None,
                  mtp_layers: int | None = None, route_groups: int | None = None,
                  route_group_topk: int | None = None, moe_step: int | None = None, window: int | None = None,
                  attn_chunk: int | None = None, global_every: int | None = None,
                  qk_norm: bool | None = None, route_consecutive: bool | None = None,
                  global_first: bool | None = None, route_load: float | None = None) -> ModelSpec:
    """`--model NAME|config.json` and/or explicit dimensions (explicit flags override).

    Without `--model`, a description from flags alone is GPT-style (LayerNorm, learned positions,
    biases, tied embeddings) unless it says `--gated-mlp` or `--norm rms`: then it is Llama-style
    (rotary positions, no biases, untied embeddings), the same inference `from_hf_config` makes;
    `--position`, `--bias/--no-bias` and `--tied-embeddings/--no-tied-embeddings` override it.
    `--head-dim` gives the heads a width of their own (q = heads × head_dim need not be hidden).
    `--experts/--top-k/--moe-ffn-hidden/--shared-expert-ffn` make every layer's MLP a mixture of experts.
    `--sliding-window W` and `--attention-chunk C [--global-every K [--global-first]]` give the layers local attention
    (0: none).
    `--qk-norm` normalises Q and K after their projections (Qwen3; a catalogue qwen3 entry already says so).
    """
    if norm is not None and norm not in NORMS:
        raise ModelError(f"--norm {norm!r}: choose one of {', '.join(NORMS)}")
    if position is not None and position not in POSITIONS:
        raise ModelError(f"--position {position!r}: choose one of {', '.join(POSITIONS)}")
    pos = None if position is None else position == "learned"
    if name:
        key = name.lower()
        if key in CATALOGUE:
            base = CATALOGUE[key]
        elif is_config_path(name):
            base = from_hf_config(os.path.join(name, "config.json") if os.path.isdir(name) else name)
        else:
            raise ModelError(f"--model {name!r} is neither a catalogue name nor a file; choose one of "
                             f"{', '.join(model_names())}, give a config.json path, or use --layers "
                             f"--hidden --heads --seq-len --vocab")
        over = {k: v for k, v in dict(layers=layers, hidden=hidden, heads=heads, seq_len=seq_len,
                                      vocab=vocab, ffn_hidden=ffn_hidden, kv_heads=kv_heads, gated=gated,
                                      norm=norm, tied=tied, learned_pos=pos, bias=bias, head_size=head_dim,
                                      experts=experts, top_k=top_k, moe_ffn_hidden=moe_ffn_hidden,
                                      shared_ffn=shared_ffn, dense_layers=dense_layers, kv_lora=kv_lora,
                                      q_lora=q_lora, rope_dim=rope_dim, v_head=v_head, mtp_layers=mtp_layers,
                                      route_groups=route_groups, route_group_topk=route_group_topk,
                                      moe_step=moe_step, window=window, attn_chunk=attn_chunk,
                                      # turning the model's local attention off (0) turns its global layers off
                                      global_every=(0 if global_every is None and ((attn_chunk == 0 and base.attn_chunk)
                                                                                   or (window == 0 and base.window))
                                                    else global_every),
                                      global_first=global_first,
                                      qk_norm=qk_norm, route_consecutive=route_consecutive,
                                      route_load=route_load).items()
                if v is not None}
        spec = replace(base, **over) if over else base
    else:
        missing = [f"--{n.replace('_', '-')}" for n, v in (("layers", layers), ("hidden", hidden),
                                                            ("heads", heads)) if v is None]
        if missing:
            raise ModelError(f"no model given: pass --model NAME (one of {', '.join(model_names())}) or "
                             f"a config.json, or all of --layers --hidden --heads (missing {' '.join(missing)})")
        llama_like = bool(gated) or norm == "rms"
        spec = ModelSpec("custom", layers, hidden, heads, seq_len or 2048, vocab or 51200,  # type: ignore[arg-type]
                         ffn_hidden, kv_heads, gated=bool(gated),
                         tied=(not llama_like) if tied is None else tied,
                         learned_pos=(not llama_like) if pos is None else pos,
                         bias=(not llama_like) if bias is None else bias,
                         norm=norm or ("rms" if llama_like else "layer"), head_size=head_dim,
                         experts=experts or 0, top_k=top_k or 0, moe_ffn_hidden=moe_ffn_hidden,
                         shared_ffn=shared_ffn or 0, dense_layers=dense_layers or 0, kv_lora=kv_lora or 0,
                         q_lora=q_lora or 0, rope_dim=rope_dim or 0, v_head=v_head, mtp_layers=mtp_layers or 0,
                         route_groups=route_groups or 0, route_group_topk=route_group_topk or 0,
                         moe_step=moe_step or 1, window=window or 0, attn_chunk=attn_chunk or 0,
                         global_every=global_every or 0, global_first=bool(global_first), qk_norm=bool(qk_norm),
                         route_consecutive=bool(route_consecutive),
                         route_load=1.0 if route_load is None else route_load)
    # the heads first: the head width divides by them
    for flag, get in (("--heads", lambda: spec.heads), ("--layers", lambda: spec.layers),
                      ("--hidden", lambda: spec.hidden), ("--seq-len", lambda: spec.seq_len),
                      ("--vocab", lambda: spec.vocab), ("--ffn-hidden", lambda: spec.ffn),
                      ("--kv-heads", lambda: spec.kv), ("--head-dim", lambda: spec.head_dim)):
        if get() < 1:
            raise ModelError(f"{flag} {get()}: must be an integer >= 1")
    validate_moe(spec)
    if spec.window and spec.attn_chunk:
        raise ModelError(f"--sliding-window {spec.window} with --attention-chunk {spec.attn_chunk}: the planner prices "
                         "one kind of local attention per model; give one of them (0 turns one off)")
    if spec.global_first and not spec.global_every:
        raise ModelError("--global-first places the global layers --global-every K names (the first and every K-th "
                         "after it): give --global-every K too, or drop --global-first")
    if spec.global_every and not (spec.attn_chunk or spec.window):
        raise ModelError(f"--global-every {spec.global_every} names the global layers among chunked or windowed ones: "
                         "give --attention-chunk C (Llama 4: 8192, one layer in 4 global) or --sliding-window W "
                         "(Gemma 3: 1024, one layer in 6 global) too")
    if not spec.mla and (spec.q_lora or spec.rope_dim or spec.v_head is not None):
        raise ModelError("--q-lora-rank/--qk-rope-dim/--v-head-dim describe multi-head latent attention: give "
                         "--kv-lora-rank R (R >= 1, DeepSeek-V3's 512) too")
    if spec.mla and spec.qk_norm:
        raise ModelError("--qk-norm with --kv-lora-rank: multi-head latent attention's norms sit on its latents, "
                         "which the planner prices already; drop --qk-norm")
    if spec.mla and spec.kv_heads not in (None, spec.heads):
        raise ModelError(f"--kv-heads {spec.kv_heads} with --kv-lora-rank: multi-head latent attention has one K/V "
                         f"per query head; drop --kv-heads")
    if spec.head_size is not None and spec.head_size * spec.heads == spec.hidden and not spec.mla:
        spec = replace(spec, head_size=None)  # the default width, said explicitly: one description of it
    if spec.head_size is None and spec.hidden % spec.heads:
        raise ModelError(f"--hidden {spec.hidden} is not divisible by --heads {spec.heads}; each head "
                         f"needs hidden/heads channels: pick heads dividing {spec.hidden}, or give the heads "
                         f"their own width with --head-dim")
    if spec.heads % spec.kv:
        raise ModelError(f"--kv-heads {spec.kv} must divide --heads {spec.heads} (each K/V head serves "
                         f"heads/kv_heads query heads); use one of "
                         f"{', '.join(str(d) for d in range(1, spec.heads + 1) if spec.heads % d == 0)}")
    return spec


def validate_moe(spec: ModelSpec) -> None:
    """A mixture of experts needs 2+ experts, a top-k among them and positive widths; a dense model none of the
    MoE fields."""
    if spec.experts == 0:
        if (spec.top_k or spec.moe_ffn_hidden is not None or spec.shared_ffn or spec.dense_layers
                or spec.route_groups or spec.route_group_topk or spec.moe_step != 1 or spec.route_consecutive
                or spec.route_load != 1.0):
            raise ModelError("--top-k/--moe-ffn-hidden/--shared-expert-ffn/--dense-layers/--moe-step/--router-groups/"
                             "--router-group-topk/--router-consecutive/--moe-load describe a mixture of experts: give "
                             "--experts N (N >= 2 routed experts per layer) too")
        return
    if not 1.0 <= spec.route_load <= 4.0:
        raise ModelError(f"--moe-load {spec.route_load:g}: the busiest expert-parallel rank's routed tokens over the "
                         "balanced share must be between 1 (balanced, as benchmarks force it) and 4; the Megatron MoE "
                         "model zoo's dropless runs of Qwen3-235B on 256 H100 (EP 8, a trained router on real data) "
                         "price at about 1.6 (docs/planner.md §2)")
    if spec.route_consecutive and (spec.route_groups or spec.route_group_topk):
        raise ModelError(f"--router-consecutive with --router-groups {spec.route_groups} --router-group-topk "
                         f"{spec.route_group_topk}: a router that gives each token consecutive experts (AutoModel's "
                         "FakeBalancedGate) applies no group limit; drop one of them")
    if spec.route_groups or spec.route_group_topk:
        if not (1 <= spec.route_group_topk < spec.route_groups and spec.experts % spec.route_groups == 0):
            raise ModelError(f"--router-groups {spec.route_groups} --router-group-topk {spec.route_group_topk}: each "
                             f"token's experts come from group-topk of the groups (1 <= group-topk < groups) and the "
                             f"groups split --experts {spec.experts} evenly (DeepSeek-V3: 8 groups, 4 per token)")
    if not 0 <= spec.dense_layers < spec.layers:
        raise ModelError(f"--dense-layers {spec.dense_layers}: the leading dense layers must leave at least one MoE "
                         f"layer of --layers {spec.layers}")
    if not 1 <= spec.moe_step <= spec.layers - spec.dense_layers:
        raise ModelError(f"--moe-step {spec.moe_step}: every moe-step-th layer is a mixture of experts, so it must be "
                         f"between 1 (all) and the {spec.layers - spec.dense_layers} layers past --dense-layers "
                         "(Llama 4 Maverick: 2)")
    if spec.experts < 2:
        raise ModelError(f"--experts {spec.experts}: a mixture of experts needs at least 2 routed experts "
                         "(0 for a dense MLP)")
    if not 1 <= spec.top_k <= spec.experts:
        raise ModelError(f"--top-k {spec.top_k}: each token runs between 1 and --experts {spec.experts} "
                         "experts; give --top-k (Mixtral 2, Qwen3-MoE 8)")
    if spec.expert_ffn < 1 or spec.shared_ffn < 0:
        raise ModelError(f"--moe-ffn-hidden {spec.expert_ffn} / --shared-expert-ffn {spec.shared_ffn}: "
                         "widths must be >= 1 (the shared expert's 0 for none)")
