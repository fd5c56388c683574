"""`par3d plan`: predict memory and step time of every DP×PP×TP configuration and pick the best.

Pure Python (no torch): the planner answers in about a second for a thousand GPUs.
Units in the output: memory in GiB (2^30 B), times in seconds, TFLOP/s = 1e12 FLOP/s.
"""

from __future__ import annotations

import argparse
import json
import sys

from par3d.argtypes import int_at_least
from par3d.commands.plan_report import (  # the report: its text, its evidence, the no-plan message
    chunk_layers,
    evidence_of,
    no_plan_message,
    precision_evidence_of,
    progress_line,
    ranking_evidence_of,
    regime_evidence_of,
    render,
    software_evidence_of,
    sweep_report,
)
from par3d.commands.train import layer_counts  # one parser for both commands' --pipeline-layout
from par3d.plan.compute import CROSS_ENTROPY, RECOMPUTE_MODULES, modules_recompute
from par3d.plan.frameworks import FRAMEWORKS, get_framework
from par3d.plan.hardware import (
    ATTENTION_KERNELS,
    CUDA_GRAPHS,
    FSDP_UNIT_S,
    MUON_TP_MODES,
    OPTIMIZERS,
    P2P_BLOCKING,
)
from par3d.plan.memory import OPTIMIZER_BYTES

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v")
V_SCHEDULES = ("zb-v", "dualpipe-v")  # two chunks per rank in a V: v = 2
RECOMPUTE = ("none", "selective", "full", "op")


class UsageError(Exception):
    """Bad input: the message names the flag, the value, the rule and a fix."""


def _gpu_counts(text: str) -> tuple[int, ...]:
    """--gpus-sweep: two or more distinct GPU counts, comma-separated, returned in ascending order."""
    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give GPU counts as whole numbers, comma-separated, e.g. "
                                         "64,128,256") from None
    if len(set(counts)) < 2 or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give two or more distinct GPU counts of at least 1, "
                                         "comma-separated, e.g. 64,128,256 (one count: --gpus)")
    return tuple(sorted(set(counts)))


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a positive number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{v} must be > 0")
    return v


def _headroom(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a fraction in [0, 1), e.g. 0.05") from None
    if not 0 <= v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be a fraction in [0, 1), e.g. 0.05 for 5%")
    return v


def _fraction(text: str) -> float:
    v = _positive_float(text)
    if v > 1:
        raise argparse.ArgumentTypeError(f"{v} must be a fraction in (0, 1], e.g. 0.15 for 15%")
    return v


def _spread(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a fraction such as 0.015") from None
    if not 0 <= v <= 0.5:
        raise argparse.ArgumentTypeError(f"{v} must be a fraction in [0, 0.5] (0.015 = a 1.5 % spread; 0 prices "
                                         f"no stragglers)")
    return v


def _bucket_params(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a parameter count such as 5e8, or 0 "
                                         f"for one bucket per layer") from None
    if not 0 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"{v} must be a parameter count >= 0 (0 = one bucket per layer)")
    return v


def register(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="predict per-GPU memory and step time of every DP x PP x TP configuration; pick the best",
        description="Given a model, a cluster and a global batch, predict the per-GPU memory and the step "
                    "time of every feasible (tp, cp, pp, dp, micro-batch, schedule, virtual stages, recompute, "
                    "ZeRO stage, sequence parallelism) and rank them, fastest first. Bubbles come from the "
                    "pipeline simulator. Any of --tp --cp --pp --dp --micro-batch --schedule --virtual-stages "
                    "--recompute --zero-stage --sequence-parallel fixes that choice; the rest is searched. "
                    "Memory is reported in GiB, times in seconds. See docs/planner.md for every formula.",
    )
    g = p.add_argument_group("model")
    g.add_argument("--model", default=None,
                   help="catalogue name (gpt3-175b, llama2-70b, llama3-8b, seed-96l, ...) or a Hugging Face "
                        "config.json path; explicit dimension flags override it")
    g.add_argument("--layers", type=int_at_least(1), help="transformer layers (overrides --model)")
    g.add_argument("--hidden", type=int_at_least(1), help="hidden size h (overrides --model)")
    g.add_argument("--heads", type=int_at_least(1), help="attention heads (overrides --model)")
    g.add_argument("--seq-len", type=int_at_least(1), help="sequence length in tokens (overrides --model)")
    g.add_argument("--vocab", type=int_at_least(2), help="vocabulary size (overrides --model)")
    g.add_argument("--ffn-hidden", type=int_at_least(1), help="MLP inner size (default 4 x hidden)")
    g.add_argument("--kv-heads", type=int_at_least(1),
                   help="key/value heads for grouped-query attention (must divide --heads; default: --heads)")
    g.add_argument("--head-dim", type=int_at_least(1), default=None,
                   help="channels per attention head when heads x head_dim is not --hidden (Gemma, Qwen3-32B, "
                        "Mistral NeMo; Megatron's --kv-channels; default: hidden / heads)")
    g.add_argument("--gated-mlp", action=argparse.BooleanOptionalAction, default=None,
                   help="SwiGLU-style gated MLP with three matrices (--gated-mlp) or a GeLU MLP with two "
                        "(--no-gated-mlp)")
    g.add_argument("--norm", choices=("layer", "rms"), default=None,
                   help="LayerNorm (weight + bias) or RMSNorm (weight only)")
    g.add_argument("--qk-norm", action=argparse.BooleanOptionalAction, default=None,
                   help="a norm on every query and key head after the QKV projection (Qwen3, Gemma 3, OLMo 2; "
                        "Megatron-Core's qk_layernorm): its kernels' traffic is priced (default: "
                        "what --model says; a catalogue qwen3 entry or a config.json of those families turns it on)")
    g.add_argument("--tied-embeddings", action=argparse.BooleanOptionalAction, default=None,
                   help="input embedding and output head share weights (--tied-embeddings) or not")
    g.add_argument("--position", choices=("learned", "rotary"), default=None,
                   help="learned position embeddings (s x h parameters) or rotary (none)")
    g.add_argument("--experts", type=int_at_least(0), default=None, metavar="E",
                   help="a mixture of experts: E routed experts in every layer's MLP (Mixtral 8, Qwen3-MoE 128; "
                        "0: dense). A config.json gives them (num_local_experts, num_experts, n_routed_experts)")
    g.add_argument("--top-k", type=int_at_least(1), default=None, metavar="K",
                   help="routed experts each token runs (Mixtral 2, Qwen3-MoE 8)")
    g.add_argument("--moe-ffn-hidden", type=int_at_least(1), default=None,
                   help="one routed expert's MLP inner size (default: --ffn-hidden, as Mixtral's config gives it)")
    g.add_argument("--shared-expert-ffn", type=int_at_least(0), default=None,
                   help="inner size of an always-on shared expert (all shared experts together; default 0: none)")
    g.add_argument("--dense-layers", type=int_at_least(0), default=None, metavar="N",
                   help="a mixture of experts whose first N layers have a dense MLP of --ffn-hidden (DeepSeek-V3 3, "
                        "Kimi K2 1; config.json's first_k_dense_replace)")
    g.add_argument("--moe-step", type=int_at_least(1), default=None, metavar="K",
                   help="a mixture of experts whose every K-th layer (after --dense-layers) is MoE and the others dense "
                        "of --ffn-hidden (Llama 4 Maverick 2; config.json's interleave_moe_layer_step or Qwen2-MoE's "
                        "decoder_sparse_step); 1 (the default): every layer")
    g.add_argument("--sliding-window", type=int_at_least(0), default=None, metavar="W",
                   help="the layers attend to the last W tokens only (Mistral 7B v0.1 4096 on every layer; Gemma 3 "
                        "1024 with --global-every 6; config.json's sliding_window): priced as the band's work; 0: none "
                        "(docs/planner.md section 2)")
    g.add_argument("--attention-chunk", type=int_at_least(0), default=None, metavar="C",
                   help="chunked attention: each token attends within its chunk of C tokens (Llama 4 8192; "
                        "config.json's attention_chunk_size); 0: none")
    g.add_argument("--global-every", type=int_at_least(0), default=None, metavar="K",
                   help="with --attention-chunk or --sliding-window: one layer in K attends over the whole sequence "
                        "(Llama 4 4, its NoPE layers; Gemma 3 6; Gemma 2 2); 0: every layer chunked or windowed")
    g.add_argument("--global-first", action=argparse.BooleanOptionalAction, default=None,
                   help="with --global-every K: the global layers are the first and every K-th after it (CWM, "
                        "Granite's windowed models: ceil(layers/K) of them) instead of the K-th, 2K-th, ... (Gemma, "
                        "Llama 4: floor(layers/K)); config.json's layer_types say which")
    g.add_argument("--mtp-layers", type=int_at_least(0), default=None, metavar="N",
                   help="multi-token prediction (DeepSeek-V3 1; config.json's num_nextn_predict_layers): N modules on "
                        "the last stage, each a layer, a 2h->h projection and a second pass of the output head")
    g.add_argument("--router-groups", type=int_at_least(1), default=None, metavar="G",
                   help="group-limited routing: the experts in G groups (DeepSeek-V3 8; config.json's n_group), with "
                        "--router-group-topk")
    g.add_argument("--router-group-topk", type=int_at_least(1), default=None, metavar="M",
                   help="each token's experts come from at most M groups (DeepSeek-V3 4; topk_group): bounds the nodes "
                        "its copies reach when the EP group spans nodes (with --ep-dispatch dedup)")
    g.add_argument("--router-consecutive", action="store_true", default=None,
                   help="a benchmark's balanced router that gives token i the k consecutive experts i*k ... i*k+k-1 "
                        "(NeMo AutoModel's fake_balanced_gate): its copies reach as few EP ranks and nodes as the "
                        "experts' order allows")
    g.add_argument("--moe-load", type=float, default=None, metavar="F",
                   help="uneven routing: the busiest expert-parallel rank receives F times the balanced share of "
                        "routed tokens, and every all-to-all, grouped GEMM and stored expert activation waits on it "
                        "(default 1: balanced, as the published MoE benchmarks force it; a trained router on real data "
                        "routes unevenly: docs/planner.md section 2 gives measured gaps); one F for every ep > 1 the "
                        "search tries, none at ep 1: give --ep with it")
    g.add_argument("--kv-lora-rank", type=int_at_least(1), default=None, metavar="R",
                   help="multi-head latent attention (DeepSeek-V2/V3, Kimi K2): K and V from a rank-R latent "
                        "(DeepSeek-V3 512); --head-dim is then the heads' no-position width (128)")
    g.add_argument("--q-lora-rank", type=int_at_least(0), default=None, metavar="R",
                   help="MLA: Q from a rank-R latent too (DeepSeek-V3 1536; 0: from the hidden state)")
    g.add_argument("--qk-rope-dim", type=int_at_least(0), default=None,
                   help="MLA: the rotary channels of each Q/K head (DeepSeek-V3 64)")
    g.add_argument("--v-head-dim", type=int_at_least(1), default=None,
                   help="MLA: V's channels per head (DeepSeek-V3 128; default --head-dim)")
    g.add_argument("--bias", action=argparse.BooleanOptionalAction, default=None,
                   help="biases in the linear layers. Without --model, flags describe a GPT (LayerNorm, "
                        "learned positions, biases, tied) unless --gated-mlp or --norm rms make it Llama-style "
                        "(rotary, no biases, untied); --position/--bias/--tied-embeddings override")
    g = p.add_argument_group("cluster")
    g.add_argument("--gpu", default="a100-80gb",
                   help="GPU from the catalogue: a100-40gb, a100-80gb, h100-sxm, h200, b200, gb200 (GB200 NVL72), b300, "
                        "gb300 (GB300 NVL72), gh200 (Grace Hopper, 96 GB HBM3, 4 per node; its sustained GEMM rate fitted to "
                        "power-capped HPC systems' runs), gh200-144gb; the export variants h800 and a800 are the "
                        "h100-sxm and a100-80gb with NVLink at 200 GB/s per direction (their datasheets' 400 GB/s); "
                        "AMD Instinct mi300x, mi325x, mi350x, mi355x (8 per node on an Infinity Fabric mesh: a TP group of g "
                        "GPUs uses g - 1 of each GPU's 7 links) (default: %(default)s)")
    g.add_argument("--gpus", type=int_at_least(1), default=8, help="number of GPUs (default: %(default)s)")
    g.add_argument("--gpus-sweep", type=_gpu_counts, default=None, metavar="N,N,...",
                   help="plan at each of these GPU counts in place of --gpus and print one line per count: the best "
                        "plan, its step time, tokens/s per GPU and that throughput against the smallest planned count's, the "
                        "days --train-tokens take and the GPU-hours a billion tokens cost, "
                        "beside how well this model has read per-GPU scaling on published runs measured at two GPU "
                        "counts (docs/planner.md section 9, scale pairs).  The global batch stays --global-batch "
                        "(strong scaling) unless --scale-batch")
    g.add_argument("--scale-batch", action="store_true",
                   help="with --gpus-sweep: grow the global batch with the GPU count (weak scaling): --global-batch "
                        "at the smallest count, times count / smallest count")
    g.add_argument("--gpus-per-node", type=int_at_least(1), default=None,
                   help="GPUs per node sharing the fast intra-node link (default: 8; 72 for gb200 and gb300, the NVL72 rack's "
                        "NVLink domain; 4 for gh200; or the hardware file's)")
    g.add_argument("--intra-node-bw", type=_positive_float, default=None,
                   help="intra-node bandwidth per GPU, one direction, GB/s (default: NVLink of the GPU, "
                        "300 for A100; Infinity Fabric on AMD, all 7 links: 448 for mi300x)")
    g.add_argument("--inter-node-bw", type=_positive_float, default=None,
                   help="inter-node bandwidth per GPU, one direction, GB/s (default: InfiniBand, 25 HDR for "
                        "A100, 50 NDR for H100/H200/B200/GB200, 100 (800 Gb/s) for B300/GB300, 25 (200 Gb/s) for GH200)")
    g.add_argument("--nics-per-node", type=int_at_least(1), default=None,
                   help="inter-node NICs per node, each at the GPU's NIC rate (default: one per GPU, as in a "
                        "DGX; e.g. 4 for 4 x 200 Gb/s on 8 GPUs); the node's NICs are shared by its GPUs")
    g.add_argument("--nic-bw", type=_positive_float, default=None, metavar="GBPS",
                   help="bandwidth of one NIC, one direction, GB/s (default: 25 HDR for A100, 50 NDR for "
                        "H100/H200/B200)")
    g.add_argument("--framework", choices=tuple(FRAMEWORKS), default="par3d",
                   help="the software that will run the plan, as its own performance configurations set what the "
                        "planner prices (plan/frameworks.py; every flag below still overrides it): "
                        + "; ".join(f"{f.name}: {f.summary}" for f in FRAMEWORKS.values())
                        + " (default: %(default)s)")
    g.add_argument("--flash-attention", action=argparse.BooleanOptionalAction, default=None,
                   help="FlashAttention on GPUs that have it (default, but off with --framework megatron-lm-2021 or "
                        "deepspeed); --no-flash-attention prices the unfused attention (s² scores written, softmax "
                        "and dropout over them) and stores them")
    g.add_argument("--attention-kernel", choices=ATTENTION_KERNELS, default=None,
                   help="the attention kernel to price: fa1 (FlashAttention-1, A100 only, ~30 %% of peak), fa2 "
                        "(FlashAttention-2, ~60 %% of peak on A100, ~35 %% on H100), fa3 "
                        "(FlashAttention-3, Hopper only; ~53 %%), or on B200/GB200 cuDNN's fused attention of a "
                        "container generation: cudnn9.13 (NGC PyTorch 25.09, ~38 %% at 8K tokens) or cudnn9.17 (NGC "
                        "25.11, ~45 %%) (default: the newest the GPU has; on B200 cudnn9.13, on GB200 cudnn9.17, "
                        "each GPU's own measurement); these are benchmarked shares, and a step keeps of them what its "
                        "GEMMs keep of theirs (docs/planner.md section 1)")
    g.add_argument("--cp-comm", choices=("ring", "all-gather", "a2a"), default="ring",
                   help="how context parallelism moves K/V: ring (blocks passed around the CP ring behind the "
                        "attention, Megatron-LM), all-gather (K/V gathered before the attention and dK/dV "
                        "reduce-scattered after it, both exposed, as Llama 3 does) or a2a (DeepSpeed-Ulysses, "
                        "Megatron-Core's cp_comm_type a2a: Q, K, V all-to-all'd from sequence shards to head shards "
                        "and the output back, exposed; each TP rank's heads must divide by cp) (default: %(default)s)")
    g.add_argument("--overlap-grad-reduce", action=argparse.BooleanOptionalAction, default=None,
                   help="the framework reduces DP gradients bucket by bucket during the backward (default: "
                        "PyTorch DDP/FSDP, Megatron-LM --overlap-grad-reduce); --no-overlap-grad-reduce: after "
                        "it (Megatron-LM before 2023, DeepSpeed's default)")
    g.add_argument("--overlap-param-gather", action=argparse.BooleanOptionalAction, default=None,
                   help="ZeRO-1/2: the updated weights' all-gather runs one bucket ahead of the next step's "
                        "forward (default: Megatron-Core --overlap-param-gather, as NeMo's and Megatron-Bridge's "
                        "recipes set it); --no-overlap-param-gather: after the optimizer, exposed (Megatron-LM's "
                        "default, DeepSpeed ZeRO-1/2)")
    g.add_argument("--dp-bucket-params", type=_bucket_params, default=None, metavar="N",
                   help="parameters per data-parallel gradient bucket, reduced (and, ZeRO-1/2, gathered) as one "
                        "collective when its last gradient is ready: DeepSpeed's reduce_bucket_size (5e8), PyTorch "
                        "DDP's bucket_cap_mb x 2^20 / 2 B, NeMo 2's 128 Mi; 0 = one bucket per layer; a rank's later "
                        "virtual-pipeline chunks stay one bucket each, as Megatron-Core builds them (default: "
                        "Megatron-Core's DDP, max(4e7, 1e6 x DP x CP); with --fsdp one bucket per layer)")
    g.add_argument("--grad-reduce-in-fp32", action=argparse.BooleanOptionalAction, default=None,
                   help="the framework reduces DP gradients in fp32 and keeps fp32 main gradients (4 B per "
                        "parameter, twice the reduction's bytes): Megatron-Core --grad-reduce-in-fp32 (Megatron-LM "
                        "turns it on for bf16), FSDP reduce_dtype=float32 (torchtitan's default), Llama 3 "
                        "(default: off, gradients reduced in the training dtype, as NVIDIA's perf recipes do)")
    g.add_argument("--deepspeed-bf16-optimizer", action="store_true", default=False,
                   help="DeepSpeed's BF16_Optimizer (bf16 with ZeRO stage 0 in the DeepSpeed config, its own ZeRO-1; "
                        "BLOOM-176B): each micro-batch's gradients added into a full fp32 buffer (6 B per parameter "
                        "held), then all-reduced in bf16 over DP, the updated bf16 shards all-gathered; plan with "
                        "--zero-stage 1")
    g.add_argument("--zero1-all-reduce", action="store_true", default=False,
                   help="ZeRO-1 reduces the gradients with a full all-reduce over DP, not a reduce-scatter, then "
                        "all-gathers the updated weights (Aleph Alpha's scaling; DeepSpeed ZeRO-1 with "
                        "reduce_scatter false); plan with --zero-stage 1 (default: ZeRO-1/2 reduce-scatter)")
    g.add_argument("--grad-reduce-cast", action="store_true", default=False,
                   help="the gradients stay in the training dtype and are cast to fp32 bucket by bucket for their "
                        "DP reduction and copied back (Aleph Alpha's scaling): 4 B per gradient on the wire, 2 B "
                        "held, unlike --grad-reduce-in-fp32's fp32 main gradients (default: off)")
    g.add_argument("--p2p-blocking", choices=P2P_BLOCKING, default=None,
                   help="whether the pipeline's point-to-point sends hold the sending GPU until delivered: none "
                        "(par3d's runtime posts each send and waits later), 1f1b (Megatron-Core, NeMo, Megatron-"
                        "Bridge: the non-interleaved 1F1B waits on each send, the interleaved schedule overlaps them "
                        "with overlap_p2p_comm), all (DeepSpeed's pipeline engine; Megatron-LM before 2023 or with "
                        "--no-overlap-p2p-communication); default: none, or the --framework's")
    g.add_argument("--p2p-partitioned", action=argparse.BooleanOptionalAction, default=None,
                   help="the pipeline's boundary tensors cross as the sender's 1/tp slice and are rebuilt by an "
                        "all-gather over TP, three a boundary a micro-batch (DeepSpeed's pipeline engine at TP > 1, "
                        "Megatron-DeepSpeed's BLOOM, MT-NLG, GPT-NeoX); plans with sequence parallelism are priced "
                        "without it: use --no-sequence-parallel (default: off; on with --framework deepspeed)")
    g.add_argument("--tp-comm-overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="overlap the TP collectives with the GEMMs next to them (Megatron-Core tp_comm_overlap, "
                        "Transformer Engine userbuffers, as NeMo/Megatron-Bridge's H100 recipes run it; needs "
                        "sequence parallelism): each all-gather hides under the GEMM that consumes it, each "
                        "reduce-scatter under the GEMM that feeds it, at the overlap slowdown (default: off, "
                        "Megatron-Core's default)")
    g.add_argument("--ep-comm-overlap", action=argparse.BooleanOptionalAction, default=False,
                   help="a mixture of experts: overlap each layer's token all-to-alls (dispatch, combine) with "
                        "another micro-batch's computation (Megatron-Core overlap_moe_expert_parallel_comm, "
                        "DualPipe-style), at the overlap slowdown; default: off, every all-to-all exposed")
    g.add_argument("--cuda-graphs", choices=CUDA_GRAPHS, default=None,
                   help="a mixture of experts run on Megatron-Core: what CUDA graphs capture.  Its dropless MoE layers "
                        "wait for the host once a layer (the tokens per expert), so without whole-iteration graphs "
                        "(partial: Transformer Engine's per-layer scopes; none) each MoE layer takes at least the "
                        "host's issue time of its kernels, a fitted 4.9 ms + 0.46 ms per routed expert on the rank "
                        "(forward + backward; docs/planner.md §6); full_iteration: no such floor (default: "
                        "full_iteration, the GPU's work alone; none with a Megatron --framework)")
    g.add_argument("--ep-dispatch", choices=("alltoall", "dedup"), default="alltoall",
                   help="a mixture of experts' tokens across nodes: alltoall (Megatron-Core's alltoall dispatcher, every "
                        "copy bound for another node crosses the NICs) or dedup (DeepEP / HybridEP, the flex dispatcher: "
                        "once per remote node, forwarded inside it over NVLink) (default: %(default)s)")
    g.add_argument("--moe-dispatcher", choices=("alltoall", "flex"), default=None,
                   help="Megatron-Core's token dispatcher of a mixture of experts: alltoall sorts the tokens a rank "
                        "receives by local expert after the dispatch and back before the combine (an extra read and "
                        "write of them each, with more than one expert per rank), flex (DeepEP / HybridEP) permutes "
                        "them once (default: flex with --ep-dispatch dedup, else alltoall)")
    g.add_argument("--ep-dispatch-fp8", action=argparse.BooleanOptionalAction, default=False,
                   help="the forward dispatch moves FP8 tokens (DeepSeek-V3, DeepEP); the combine and the backward stay "
                        "16-bit (default: off)")
    g.add_argument("--offload-layers", type=int_at_least(0), default=0, metavar="N",
                   help="offload the activations of N transformer layers to host memory during the forward and "
                        "reload them for the backward (Megatron-Core --cpu-offloading-num-layers; over NVLink-C2C "
                        "on gb200/gb300/gh200, PCIe elsewhere): memory holds the other layers and two buffers, each "
                        "offloaded layer waits for its copy where the copy is slower than its compute; Megatron-Core "
                        "runs it without pipeline parallelism or recomputation, so the search keeps to those "
                        "(default: %(default)s)")
    g.add_argument("--offload-optimizer", type=_fraction, default=None, metavar="FRACTION",
                   help="keep this share of each rank's optimizer states (fp32 master, m, v) in host memory and step "
                        "it there (Megatron-Core --optimizer-cpu-offload --optimizer-offload-fraction; DeepSpeed's "
                        "offload_optimizer is 1): the states leave GPU memory, and the step copies the fp32 "
                        "gradients down and the weights up over PCIe / NVLink-C2C while the CPU runs Adam at its "
                        "DRAM's line rate, pipelined as --overlap-cpu-optimizer-d2h-h2d runs them (a lower bound of "
                        "that time; never checked against a measured run). Adam only. Default: none offloaded")
    g.add_argument("--fp8-scaling", choices=("delayed", "current", "mxfp8", "nvfp4"), default="delayed",
                   help="with --dtype fp8, how Transformer Engine scales each FP8 tensor: delayed (the amax of "
                        "earlier steps, fused into the cast), current (Float8CurrentScaling: an amax pass "
                        "over the tensor before each cast, one more read of it) or mxfp8 (MXFP8BlockScaling, "
                        "Blackwell only: a scale per 32 elements found in the cast; its block-scaled GEMMs at "
                        "1.75x the BF16 rate, as Transformer Engine measured them on a B300); nvfp4 is "
                        "--dtype nvfp4 (default: %(default)s)")
    g.add_argument("--fp8-attention", action=argparse.BooleanOptionalAction, default=False,
                   help="with --dtype fp8 or nvfp4, the attention kernel in FP8 (Transformer Engine's "
                        "fp8_dot_product_attention, Megatron-Core --fp8-dot-product-attention): cuDNN's measured "
                        "FP8/BF16 speed-up at each sequence length (B200, GB200, B300, GB300; e.g. 1.22x on a B200 "
                        "at 8,192 tokens) (default: BF16 attention)")
    g.add_argument("--fp8-param-gather", action=argparse.BooleanOptionalAction, default=None,
                   help="with --dtype fp8, the distributed optimizer (ZeRO-1/2) gathers updated weights as fp8 "
                        "copies, 1 B each, as Megatron-Core's fp8_param_gather does (on in NeMo 2's and "
                        "Megatron-Bridge's FP8 presets and MLPerf's NeMo configs); with --dtype nvfp4 as NVFP4 "
                        "copies, 0.5625 B (fp4_param_gather); default: bf16 gathers, 2 B")
    g.add_argument("--cross-entropy", choices=CROSS_ENTROPY, default=None,
                   help="how the loss's cross-entropy over the logits runs, priced as the HBM bytes its kernels "
                        "move per logit: unfused (52 B: Megatron-Core's default VocabParallelCrossEntropy; "
                        "PyTorch's F.cross_entropy on fp32 logits, 48 B), fused (28 B: Megatron-Core "
                        "--cross-entropy-loss-fusion, native; NeMo 2's default) or kernel (10 B: one fused "
                        "kernel pair, Transformer Engine's parallel cross entropy as Megatron-Bridge's perf "
                        "recipes set it, flash-attn's CrossEntropyLoss) or gathered (52 B over the whole "
                        "vocabulary on every TP rank after an all-gather of the logits: Aleph Alpha's scaling) "
                        "(default: unfused, or the --framework's)")
    g.add_argument("--elementwise", choices=("fused", "eager"), default=None,
                   help="whose non-GEMM kernels (norms, rotary, activation, residuals) a step runs: fused "
                        "(Megatron-Core / Transformer Engine's fused kernels, what published runs use) or eager "
                        "(par3d train's own model, each line a PyTorch kernel, RMSNorm and rotary in fp32: "
                        "plan/eager.py) (default: what the --hardware file says, which `par3d calibrate` "
                        "on a GPU writes as eager; fused otherwise)")
    g.add_argument("--zero3-unit", choices=("layer", "submodule"), default=None,
                   help="what ZeRO-3 gathers at a time: a whole layer, prefetched one layer ahead, its rings "
                        "over the node's NICs (default: par3d, PyTorch FSDP) or each weight matrix by its "
                        "sub-module's hook, one matrix ahead, at one NIC per GPU (submodule: DeepSpeed's ZeRO-3 "
                        "with its default 5e7-element prefetch bucket, as measured in 2021)")
    g.add_argument("--fsdp", action=argparse.BooleanOptionalAction, default=False,
                   help="the data-parallel runtime is PyTorch FSDP (ZeRO-3 as FULL_SHARD or HSDP, ZeRO-2 as "
                        "SHARD_GRAD_OP, ZeRO-0 as DDP; no ZeRO-1), each layer one wrapped unit, as llm-foundry, "
                        f"fms-fsdp and torchtitan run it: every unit costs a fitted {FSDP_UNIT_S * 1e3:g} ms per "
                        "micro-batch beyond its collectives (docs/planner.md §9, fifteenth round); default: "
                        "Megatron-Core's distributed optimizer / Megatron-FSDP")
    g.add_argument("--fsdp-version", type=int, choices=(1, 2), default=None,
                   help="which PyTorch FSDP, with --fsdp: 2 = fully_shard (torchtitan, NeMo AutoModel), whose "
                        "ZeRO-3 gathers land in a flat buffer that is then copied out to the parameters on the "
                        "compute stream (priced: the layer's weights read and written once more at HBM rate after "
                        "each gather); 1 = the FlatParameter FullyShardedDataParallel (llm-foundry, fms-fsdp) or "
                        "FairScale, whose parameters are views of the gathered tensor (default: 2)")
    g.add_argument("--dtype", choices=("bf16", "fp16", "fp8", "nvfp4", "fp32"), default="bf16",
                   help="training precision: bf16 or fp16 mixed precision, fp8 GEMMs (Transformer Engine "
                        "style, on GPUs with fp8 tensor cores: H100 and later), nvfp4 (Transformer Engine's "
                        "NVFP4BlockScaling, Blackwell only: the layers' GEMMs in 4 bits at 3.42x the BF16 rate, "
                        "as Transformer Engine measured them on a B300, their quantization at its measured cost, "
                        "everything else as fp8 training; Megatron-Core --fp4-format e2m1) or fp32 "
                        "(default: %(default)s)")
    g.add_argument("--straggler-cv", type=_spread, default=None, metavar="CV",
                   help="spread of the GPUs' step times (coefficient of variation, e.g. 0.015); a synchronous "
                        "step runs at the slowest GPU's pace, cv x E[max of N normals] behind the mean "
                        "(default: the hardware file's straggler_cv, else 0.015 — the spread Sinha et al. (SC'22) "
                        "measured across clusters of one GPU model — on GPU clusters; 0 under the seed's flat model "
                        "(--efficiency) and on a calibrated CPU host)")
    g.add_argument("--hardware", metavar="FILE", default=None,
                   help="JSON/TOML hardware description (written by `par3d calibrate`); replaces --gpu")
    g.add_argument("--efficiency", type=_fraction, default=None,
                   help="achievable fraction of peak FLOP/s for large GEMMs (default 0.48 = the seed's "
                        "150 of 312 TFLOP/s, or the hardware file's calibrated value)")
    g = p.add_argument_group("batch")
    g.add_argument("--global-batch", type=int_at_least(1), default=512,
                   help="sequences per optimizer step over all DP ranks (default: %(default)s)")
    g.add_argument("--train-tokens", type=_positive_float, default=300e9,
                   help="token budget for the time-to-train estimate (default: 3e11, GPT-3's)")
    g = p.add_argument_group("fixed choices (searched when omitted)")
    g.add_argument("--tp", type=int_at_least(1), help="tensor-parallel size (must divide heads)")
    g.add_argument("--cp", type=int_at_least(1),
                   help="context-parallel size: ring attention over cp ranks, each holding seq_len/cp tokens "
                        "(seq_len must be divisible by 2 x cp). Searched, when omitted, while seq_len/cp >= 4096")
    g.add_argument("--pp", type=int_at_least(1), help="pipeline-parallel size (uneven layer splits allowed)")
    g.add_argument("--ep", type=int_at_least(1),
                   help="expert-parallel size (a mixture of experts): the routed experts split over ep of the tp x cp "
                        "x dp ranks of a stage, experts/ep whole experts each (Megatron-Core's parallel folding, "
                        "each expert whole on a rank unless --etp); must divide --experts. Searched when omitted")
    g.add_argument("--etp", type=int_at_least(1),
                   help="expert-tensor-parallel size (a mixture of experts; Megatron-Core's "
                        "--expert-tensor-parallel-size): each routed expert's fc1 split by columns and fc2 by rows over "
                        "etp ranks, which all-gather the copies they receive and reduce-scatter the outputs (fp32); "
                        "ep x etp must divide tp x cp x dp, etp the expert width. Searched when omitted over 1 "
                        "(Megatron-Bridge's recipes) and the layout's tp (Megatron-Core's default when the size is "
                        "left unset); --etp 1 plans a recipe's run")
    g.add_argument("--dp", type=int_at_least(1), help="data-parallel size")
    g.add_argument("--micro-batch", type=int_at_least(1), help="sequences per micro-batch per DP rank")
    g.add_argument("--schedule", choices=SCHEDULES,
                   help="pipeline schedule; zb-v and dualpipe-v hold stages r and 2p-1-r on rank r (v = 2, "
                        "dualpipe-v m >= 2 x pp); searched among all when omitted")
    g.add_argument("--virtual-stages", type=int_at_least(1),
                   help="model chunks per pipeline rank v (> 1 implies --schedule interleaved; 2 with zb-v and "
                        "dualpipe-v)")
    g.add_argument("--recompute", choices=RECOMPUTE,
                   help="activation recomputation: none; selective (Megatron's: the attention core); full (every "
                        "layer; with --recompute-layers N the first N of each chunk); op (torchtitan's selective op "
                        "checkpointing: matmul and attention outputs saved except every second matmul, the rest "
                        "recomputed; only when given: the search tries none, selective, full and the block method)")
    g.add_argument("--recompute-modules", metavar="M,M,...",
                   help="Megatron-Core's selective recomputation of named modules (--recompute-granularity selective "
                        "--recompute-modules ...): any of core_attn (the attention core, what --recompute selective "
                        "alone means), mla_up_proj (MLA's Q and K/V up projections), layernorm (the two norms), mlp "
                        "(a dense MLP), moe (a mixture of experts' whole block, its all-to-alls again), moe_act (the "
                        "routed experts' activation), shared_experts; each stops storing what it holds inside and "
                        "runs its forward again in the backward; implies --recompute selective")
    g.add_argument("--recompute-layers", type=int_at_least(1), metavar="N",
                   help="full recomputation of only the first N layers of every pipeline chunk, the rest keeping "
                        "their activations (Megatron-LM's --recompute-method block --recompute-num-layers N); "
                        "implies --recompute full")
    g.add_argument("--pipeline-layout", type=layer_counts, default=None, metavar="N,N,...",
                   help="layers of each pipeline chunk in model order, pp x virtual-stages counts (the first chunk "
                        "also holds the embedding, the last the output head and loss; those two may be 0), as "
                        "Megatron-Core's --pipeline-model-parallel-layout or --decoder-first/last-pipeline-num-layers "
                        "cut the model, e.g. 31,32,32,31 for 126 layers on pp 4 with the embedding and the loss "
                        "counted as a layer each; needs --pp (--virtual-stages: the counts over pp, when omitted). Default: the planner's "
                        "balanced partition (layers and the head weighed by their FLOPs)")
    g.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), help="ZeRO stage over the DP group")
    g.add_argument("--dp-replicate", type=int_at_least(1),
                   help="HSDP: split the DP group into this many replicas; ZeRO shards its states inside each "
                        "replica (dp / N ranks x cp, the nearer ranks) and all-reduces the shards' gradients "
                        "across replicas (torchtitan's data_parallel_replicate_degree, FSDP HYBRID_SHARD, "
                        "Megatron's num_distributed_optimizer_instances); needs ZeRO >= 1. Default: searched "
                        "between 1 (shard over the whole group) and one replica per node under ZeRO-3")
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="Megatron sequence parallelism on (--sequence-parallel) or off "
                        "(--no-sequence-parallel); default: on whenever tp > 1")
    g = p.add_argument_group("memory")
    g.add_argument("--memory-accounting", choices=("seed", "megatron"), default="seed",
                   help="model-state bytes per parameter: seed = 2 B weights + 2 B gradients + 12 B Adam "
                        "(16 B); megatron = Megatron-LM's fp32 main gradients (18 B; its distributed optimizer "
                        "= ZeRO-1: 6 + 12/d) (default: %(default)s)")
    g.add_argument("--optimizer-dtype", choices=tuple(OPTIMIZER_BYTES), default="fp32",
                   help="Adam's state (master copy, m, v) per parameter: fp32 = 12 B; bf16 = 6 B, as NeMo's "
                        "distributed_fused_adam with dtype bf16 keeps it; Megatron-Core's precision-aware optimizer: "
                        "bf16-moments = fp32 master + bf16 m, v, 8 B (--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16); "
                        "remainders = 16-bit master remainders + fp32 m, v, 10 B (TE's store_param_remainders, "
                        "BF16 training); remainders-bf16-moments = 6 B (default: %(default)s)")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="adam",
                   help="the weight matrices' optimizer: adam = mixed-precision Adam / AdamW (fp32 master, m, v); "
                        "muon = Megatron-Core's Muon (Megatron-Bridge's dist_muon, its Kimi K2 recipes' default): "
                        "an fp32 momentum beside the fp32 master (8 B, not 12), each matrix's update orthogonalized "
                        "by 5 Newton-Schulz steps priced at the bf16 GEMM rate and shared over the data-parallel "
                        "group with ZeRO >= 1 (its layer-wise distributed optimizer); the embedding and output "
                        "layer stay on Adam (default: %(default)s)")
    g.add_argument("--muon-tp-mode", choices=MUON_TP_MODES, default="blockwise",
                   help="--optimizer muon with TP: blockwise = each rank orthogonalizes its own shard "
                        "(Megatron-Bridge's recipes); duplicated = each whole matrix gathered over TP in fp32 and "
                        "orthogonalized on every TP rank (Megatron-Core's default) (default: %(default)s)")
    g.add_argument("--memory-headroom", type=_headroom, default=0.05,
                   help="share of each GPU's memory a fitting plan leaves free (default: %(default)s)")
    g.add_argument("--ignore-memory", action="store_true",
                   help="rank plans whatever the memory model says of them, marking those over the usable "
                        "memory with '!': to price a layout that ran although memory.py rejects it (memory.py "
                        "counts no framework's savings beyond docs/planner.md section 3)")
    g = p.add_argument_group("limits and output")
    g.add_argument("--max-bubble", type=_fraction, default=None,
                   help="reject plans whose simulated bubble (idle share of wall time) exceeds this fraction")
    g.add_argument("--allow-inter-node-tp", action="store_true",
                   help="let tensor parallelism span nodes (default: TP stays inside a node)")
    g.add_argument("--schedules", type=_schedule_list, default=None, metavar="LIST",
                   help="comma-separated pipeline schedules the search may pick, those the framework that will "
                        f"run the plan has (of {', '.join(SCHEDULES)}): e.g. 1f1b,interleaved for Megatron-LM, "
                        "1f1b for DeepSpeed; default: all")
    g.add_argument("--max-virtual-stages", type=int_at_least(2), default=8,
                   help="largest v searched for the interleaved schedule (default: %(default)s)")
    g.add_argument("--top", type=int_at_least(1), default=5,
                   help="plans to show (default: %(default)s); the 'ranking:' line compares the best with the nearest "
                        "plan of another layout among them, so --top 1 drops it")
    g.add_argument("--explain", action="store_true",
                   help="print the winner's breakdown, the seed-style per-layer accounting and why it wins")
    g.add_argument("--json", action="store_true",
                   help="print {model, hardware, plans: [...], evidence} as JSON (evidence: the model's signed error "
                        "on the validation set's published runs of this GPU and dtype, null if none)")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show the search's progress on stderr (layouts enumerated, then the finalists priced); "
                        "default: when stderr is a terminal -- a mixture of experts' search takes seconds")
    g.add_argument("--emit-config", metavar="FILE", default=None,
                   help="write a `par3d train` TOML config of the best plan (restricted to the ZeRO stages "
                        "and context parallelism the runtime supports)")
    g.add_argument("--emit-smoke", action="store_true",
                   help="with --emit-config: the same architecture and layout at CPU size (one layer per "
                        "pipeline chunk, 16 channels per head, vocab 256, seq 64, micro-batch 1, at most 8 "
                        "micro-batches, 3 steps, fp32) "
                        "for a smoke test of the plan with `par3d train --config FILE`")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except UsageError as e:
        print(f"par3d plan: error: {e}", file=sys.stderr)
        return 2


# the flags a --framework sets, by the Cluster field each sets (their argparse default is None, so that a flag given
# wins over the framework, and the framework over par3d's own value: the Cluster field's default)
_FLAG_OF_FIELD = {"flash_attention": "flash_attention", "overlap_grad_reduce": "overlap_grad_reduce",
                  "overlap_param_gather": "overlap_param_gather", "grad_reduce_fp32": "grad_reduce_in_fp32",
                  "p2p_blocking": "p2p_blocking", "p2p_partitioned": "p2p_partitioned",
                  "tp_comm_overlap": "tp_comm_overlap", "fp8_param_gather": "fp8_param_gather",
                  "cross_entropy": "cross_entropy", "zero3_unit": "zero3_unit"}


def apply_framework(args: argparse.Namespace) -> None:
    """Fill the software flags the user left unset: from --framework's facts (plan/frameworks.py), then par3d's
    defaults; sets `args.megatron_split` (Megatron-Core's pipeline split where no --pipeline-layout is given)."""
    from dataclasses import fields

    from par3d.plan.hardware import Cluster

    fw = get_framework(args.framework)
    facts = fw.resolve(args.dtype, sequence_parallel=bool(args.sequence_parallel), fsdp=args.fsdp)
    if args.schedules is None and args.schedule is None and fw.schedules is not None:  # the schedules it has
        args.schedules = fw.schedules
    if args.sequence_parallel is None and not fw.sequence_parallel:  # a framework without it: not searched
        args.sequence_parallel = False
    version = facts.pop("fsdp_version", None)
    if args.fsdp and args.fsdp_version is None and version is not None:
        args.fsdp_version = version
    if args.cuda_graphs is None:  # not a Cluster field: it sets the MoE host floor (hardware.moe_host_of)
        args.cuda_graphs = facts.pop("cuda_graphs", "full_iteration")
    for name, value in facts.items():
        dest = _FLAG_OF_FIELD.get(name, name)
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    defaults = {f.name: f.default for f in fields(Cluster)}
    for name, dest in _FLAG_OF_FIELD.items():
        if getattr(args, dest) is None:
            setattr(args, dest, defaults[name])
    args.megatron_split = fw.megatron_split


def _cluster(args: argparse.Namespace):
    from par3d.plan.hardware import (
        DEFAULT_GPUS_PER_NODE,
        HardwareError,
        default_gpus_per_node,
        get_device,
        load_hardware_file,
        make_cluster,
        with_attention_kernel,
    )

    asked = args.dtype  # what the user typed, for the errors below (nvfp4 is priced as fp8 with 4-bit GEMMs)
    if args.dtype == "nvfp4":  # NVFP4 is Transformer Engine's fourth recipe: FP8 training with 4-bit layer GEMMs
        if args.fp8_scaling not in ("delayed", "nvfp4"):
            raise UsageError(f"--dtype nvfp4 with --fp8-scaling {args.fp8_scaling}: NVFP4 is a recipe of its own "
                             f"(its scales per 16 elements and per tensor); drop --fp8-scaling")
        args.dtype, args.fp8_scaling = "fp8", "nvfp4"
    rack = False
    try:
        if args.hardware:
            from dataclasses import replace

            from par3d.plan.hardware import GB
            from par3d.plan.profile import cluster_from_file

            if args.fp8_attention:
                raise UsageError("--fp8-attention with --hardware: FP8 attention is priced from cuDNN's measured "
                                 "speed-ups on catalogue Blackwell GPUs only; drop one of them")
            hw = load_hardware_file(args.hardware)
            from par3d.host import warn_if_other_host

            warn_if_other_host(args.hardware, hw.extra, "par3d plan")
            if args.efficiency is not None:
                hw = replace(hw, device=replace(hw.device, efficiency=args.efficiency))
            if args.intra_node_bw:
                hw = replace(hw, intra=replace(hw.intra, beta=args.intra_node_bw * GB))
            if args.inter_node_bw:
                hw = replace(hw, inter=replace(hw.inter, beta=args.inter_node_bw * GB))
            if args.dtype not in hw.device.peak_flops:
                raise UsageError(f"--dtype {args.dtype}: the hardware file {args.hardware} has no peak for it; "
                                 f"add device.peak_tflops.{args.dtype} or use --dtype "
                                 f"{next(iter(hw.device.peak_flops))}")
            # the file's runtime profile too: the same model as `par3d train --hardware`'s prediction
            cl = cluster_from_file(hw, args.gpus, args.dtype, args.gpus_per_node)
            if args.efficiency is not None:  # a fixed efficiency: the flat kernel model
                cl = replace(cl, device=replace(cl.device, gemm={}))
            nic = args.nic_bw * GB if args.nic_bw else cl.inter.beta
            if args.nics_per_node or args.nic_bw:  # the file's inter link is one NIC per GPU
                cl = replace(cl, inter=replace(cl.inter, beta=nic * (args.nics_per_node or cl.gpus_per_node)
                                               / cl.gpus_per_node), nics_per_node=args.nics_per_node)
            cl = replace(cl, flash_attention=args.flash_attention, cp_comm=args.cp_comm,
                         device=with_attention_kernel(cl.device, args.attention_kernel))
        else:
            dev = get_device(args.gpu)
            gpn = args.gpus_per_node or default_gpus_per_node(dev.name)
            # a catalogue GPU whose NVLink domain is a rack (GB200 NVL72): a job may take part of one
            rack = args.gpus_per_node is None and dev.name in DEFAULT_GPUS_PER_NODE
            if args.dtype not in dev.peak_flops:
                have = ", ".join(d for d in ("bf16", "fp16", "fp8", "fp32") if d in dev.peak_flops)
                raise UsageError(f"--dtype {asked}: {dev.name} has no {asked} tensor cores; use "
                                 f"--dtype {have.split(', ')[0]} (it has {have}) or a GPU that has it "
                                 f"(--gpu {'b200' if asked == 'nvfp4' else 'h100'})")
            cl = make_cluster(args.gpu, args.gpus, min(gpn, args.gpus), args.intra_node_bw, args.inter_node_bw,
                              args.dtype, args.efficiency, nics_per_node=args.nics_per_node,
                              nic_bw_gbps=args.nic_bw, flash_attention=args.flash_attention,
                              attention_kernel=args.attention_kernel, cp_comm=args.cp_comm,
                              fp8_attention=args.fp8_attention)
    except HardwareError as e:
        flag = "--hardware" if args.hardware else "--gpu"
        msg = str(e)
        raise UsageError(msg if msg.startswith("--") else f"{flag} {args.hardware or args.gpu}: {msg}") from None
    from dataclasses import replace as _replace

    from par3d.plan.hardware import moe_host_of

    cl = _replace(cl, overlap_grad_reduce=args.overlap_grad_reduce, overlap_param_gather=args.overlap_param_gather,
                  grad_reduce_fp32=args.grad_reduce_in_fp32, bf16_optimizer=args.deepspeed_bf16_optimizer,
                  zero1_all_reduce=args.zero1_all_reduce, grad_reduce_cast=args.grad_reduce_cast,
                  zero3_unit=args.zero3_unit, fsdp=args.fsdp, fsdp_version=args.fsdp_version or 2,
                  tp_comm_overlap=args.tp_comm_overlap, ep_comm_overlap=args.ep_comm_overlap,
                  p2p_blocking=args.p2p_blocking, p2p_partitioned=args.p2p_partitioned,
                  moe_host_s=moe_host_of(args.cuda_graphs),
                  ep_dispatch=args.ep_dispatch, ep_dispatch_fp8=args.ep_dispatch_fp8,
                  moe_dispatcher=args.moe_dispatcher or "", fp8_scaling=args.fp8_scaling,
                  fp8_param_gather=args.fp8_param_gather, cross_entropy=args.cross_entropy,
                  elementwise=args.elementwise or cl.elementwise,
                  offload_layers=args.offload_layers, dp_bucket_params=args.dp_bucket_params,
                  optimizer=args.optimizer, muon_tp_mode=args.muon_tp_mode,
                  offload_optimizer=args.offload_optimizer or 0.0,
                  straggler_cv=args.straggler_cv if args.straggler_cv is not None else cl.straggler_cv)
    from par3d.plan.hardware import fp8_scaling_error

    bad_fp8 = fp8_scaling_error(cl.device.name, cl.dtype, cl.fp8_scaling)
    if bad_fp8:
        flag = "--dtype nvfp4" if cl.fp8_scaling == "nvfp4" else f"--fp8-scaling {args.fp8_scaling}"
        raise UsageError(f"{flag}: {bad_fp8}")
    if args.offload_optimizer:
        from par3d.plan.hardware import HOST_MEM

        if cl.device.name not in HOST_MEM:
            raise UsageError(f"--offload-optimizer with {cl.device.name}: the planner has no figure for its host's "
                             f"memory bandwidth (it has {', '.join(sorted(HOST_MEM))}); drop --offload-optimizer or "
                             "plan one of those GPUs")
        if args.optimizer != "adam":
            raise UsageError(f"--offload-optimizer with --optimizer {args.optimizer}: Megatron-Core's CPU offload "
                             "steps Adam; drop one of the two")
        if args.emit_config:
            raise UsageError("--offload-optimizer with --emit-config: par3d train keeps its optimizer on the GPU; "
                             "drop one of the two")
    if args.offload_layers and ((args.pp or 1) > 1 or args.recompute not in (None, "none")):
        raise UsageError(f"--offload-layers {args.offload_layers}: Megatron-Core offloads activations only without "
                         "pipeline parallelism and without recomputation; drop --pp/--recompute or --offload-layers")
    if args.fsdp_version is not None and not args.fsdp:
        raise UsageError(f"--fsdp-version {args.fsdp_version} without --fsdp: it says which PyTorch FSDP runs the data "
                         "parallelism; add --fsdp or drop --fsdp-version")
    if args.fsdp and args.zero3_unit == "submodule":
        raise UsageError("--fsdp with --zero3-unit submodule: PyTorch FSDP wraps whole layers, DeepSpeed's ZeRO-3 "
                         "gathers by sub-module; drop one of them")
    if args.fsdp and args.zero_stage == 1:
        raise UsageError("--fsdp with --zero-stage 1: PyTorch FSDP shards the optimizer state only with the "
                         "gradients (SHARD_GRAD_OP = 2) or everything (FULL_SHARD = 3); use --zero-stage 2 or 3, "
                         "0 for DDP, or drop --fsdp")
    # flags that describe ZeRO-1 alone: the search's other stages are not what they say
    given = f"with --zero-stage {args.zero_stage}" if args.zero_stage is not None else "without --zero-stage 1"
    if args.deepspeed_bf16_optimizer and args.zero_stage != 1:
        raise UsageError(f"--deepspeed-bf16-optimizer {given}: DeepSpeed's BF16_Optimizer shards the optimizer state "
                         "as ZeRO-1 does and nothing else (the search's other stages are not it); add --zero-stage 1")
    if args.zero1_all_reduce and args.zero_stage != 1:
        raise UsageError(f"--zero1-all-reduce {given}: it says how ZeRO-1 reduces its gradients; add --zero-stage 1 "
                         "or drop --zero1-all-reduce")
    if args.p2p_partitioned and args.sequence_parallel:
        raise UsageError("--p2p-partitioned with --sequence-parallel: DeepSpeed's pipeline engine partitions whole "
                         "boundary tensors, and a sequence-parallel one is not modelled so; use --no-sequence-parallel")
    if args.grad_reduce_cast and args.grad_reduce_in_fp32:
        raise UsageError("--grad-reduce-cast with --grad-reduce-in-fp32: the gradients are held either in the "
                         "training dtype (cast for the reduction) or in fp32; keep one")
    if args.deepspeed_bf16_optimizer and (args.fsdp or cl.dtype != "bf16"):
        raise UsageError("--deepspeed-bf16-optimizer: it is DeepSpeed's bf16 optimizer; use --dtype bf16 and drop "
                         "--fsdp")
    if args.fsdp and not cl.hier:
        raise UsageError("--fsdp: its per-unit cost is fitted on GPU clusters and the calibrated host's or flat "
                         "model has no place for it; use a catalogue --gpu without --efficiency, or drop --fsdp")
    # whole nodes, except a rack-scale NVLink domain taken in part (comm.py prices a group by the ranks it spans)
    if cl.gpus > cl.gpus_per_node and cl.gpus % cl.gpus_per_node and not rack:
        raise UsageError(f"--gpus {cl.gpus}: must be a multiple of --gpus-per-node {cl.gpus_per_node} "
                         f"(whole nodes); use --gpus {cl.gpus // cl.gpus_per_node * cl.gpus_per_node or cl.gpus_per_node}"
                         f" or {(cl.gpus // cl.gpus_per_node + 1) * cl.gpus_per_node}")
    return cl


def _schedule_list(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in names if t not in SCHEDULES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: schedules are {', '.join(SCHEDULES)}, comma-separated "
                                         f"(e.g. 1f1b,interleaved)")
    return names


def _with_layout(model, args: argparse.Namespace):
    """The model cut as --pipeline-layout says (models.ModelSpec.pipeline_split), checked against the model and the
    fixed --pp / --virtual-stages before anything is searched."""
    from dataclasses import replace

    from par3d.plan.models import split_error

    split = tuple(args.pipeline_layout)
    flag = f"--pipeline-layout {','.join(map(str, split))}"
    why = split_error(model.layers, split)
    if why:
        raise UsageError(f"{flag}: {why}")
    if args.pp is None:
        raise UsageError(f"{flag} needs --pp: the layout cuts the model into pp x virtual-stages chunks; add --pp "
                         f"{len(split)} (one chunk per stage) or --pp P --virtual-stages {len(split)}/P")
    v = args.virtual_stages or (len(split) // args.pp if len(split) % args.pp == 0 else 1)  # unset: as the layout says
    if args.pp * v != len(split):
        raise UsageError(f"{flag}: {len(split)} chunks, but --pp {args.pp} x --virtual-stages {v} = {args.pp * v}; "
                         f"give {args.pp * v} counts or set --virtual-stages {len(split) // args.pp}"
                         if len(split) % args.pp == 0 else
                         f"{flag}: {len(split)} chunks, but --pp {args.pp} x --virtual-stages {v} = {args.pp * v}; "
                         f"give pp x virtual-stages counts")
    return replace(model, pipeline_split=split)


def _check_fixed(args: argparse.Namespace, model, cluster) -> None:
    n = cluster.gpus
    for flag, v in (("--tp", args.tp), ("--cp", args.cp), ("--pp", args.pp), ("--dp", args.dp)):
        if v is not None and n % v:
            raise UsageError(f"{flag} {v}: tp x cp x pp x dp must equal --gpus {n}, so {flag} must divide {n}")
    fixed = [v for v in (args.tp, args.cp, args.pp, args.dp) if v is not None]
    prod = 1
    for v in fixed:
        prod *= v
    if len(fixed) == 4 and prod != n:
        raise UsageError(f"--tp {args.tp} --cp {args.cp} --pp {args.pp} --dp {args.dp}: the product {prod} must "
                         f"equal --gpus {n}; drop one of them to let the planner derive it")
    if len(fixed) == 3 and args.cp is None and prod != n:
        raise UsageError(f"--tp {args.tp} --pp {args.pp} --dp {args.dp}: the product {prod} must equal "
                         f"--gpus {n} (or add --cp {n // prod if n % prod == 0 else 'N'}); drop one of them to "
                         f"let the planner derive it")
    if prod > n or n % prod:
        raise UsageError(f"--tp/--cp/--pp/--dp: their product {prod} must divide --gpus {n}")
    if args.cp is not None and args.cp > 1 and model.seq_len % (2 * args.cp):
        raise UsageError(f"--cp {args.cp}: ring attention with causal load balancing cuts each sequence into "
                         f"2 x cp chunks, so --seq-len {model.seq_len} must be divisible by {2 * args.cp}; use a "
                         f"--cp whose double divides it")
    if args.ignore_memory and args.emit_config:
        raise UsageError("--ignore-memory with --emit-config: the config written is a run, and a plan ranked over the "
                         "memory model would be written whether it fits or not; drop one of the two")
    if args.schedules is not None and args.schedule is not None and args.schedule not in args.schedules:
        raise UsageError(f"--schedule {args.schedule}: not among --schedules {','.join(args.schedules)}; add it "
                         f"to --schedules or drop one of the two")
    if args.offload_layers >= model.layers:
        raise UsageError(f"--offload-layers {args.offload_layers}: at least one of the model's {model.layers} layers "
                         f"keeps its activations on the GPU (Megatron-Core's rule); use --offload-layers <= "
                         f"{model.layers - 1}")
    if args.pp is not None and args.pp > model.layers:
        raise UsageError(f"--pp {args.pp}: every pipeline stage needs a layer and the model has "
                         f"{model.layers}; use --pp <= {model.layers}")
    if args.dp is not None and args.global_batch % args.dp:
        raise UsageError(f"--global-batch {args.global_batch}: must be divisible by --dp {args.dp}; use "
                         f"--global-batch {max(args.dp, args.global_batch // args.dp * args.dp)}")
    if args.micro_batch is not None and args.global_batch % args.micro_batch:
        raise UsageError(f"--micro-batch {args.micro_batch}: must divide --global-batch {args.global_batch} "
                         f"(global = micro-batch x micro-batches x dp)")
    if args.schedule in V_SCHEDULES:
        _check_v(args, model)
    elif args.virtual_stages is not None and args.virtual_stages > 1:
        if args.schedule not in (None, "interleaved"):
            raise UsageError(f"--virtual-stages {args.virtual_stages}: only the interleaved schedule has "
                             f"virtual stages; use --schedule interleaved or --virtual-stages 1")
        args.schedule = "interleaved"
    if args.schedule == "interleaved" and args.virtual_stages == 1:
        raise UsageError("--schedule interleaved needs --virtual-stages >= 2 (or omit it to search v)")
    if args.fp8_param_gather and cluster.dtype != "fp8":
        raise UsageError(f"--fp8-param-gather with --dtype {cluster.dtype}: only fp8 training gathers fp8 weight "
                         "copies; add --dtype fp8 or drop --fp8-param-gather")
    if getattr(args, "emit_smoke", False) and not args.emit_config:
        raise UsageError("--emit-smoke shrinks the config --emit-config writes; add --emit-config FILE")
    if args.emit_config:
        max_zero, has_cp = runtime_support()
        if args.fsdp:
            raise UsageError("--fsdp with --emit-config: the config is for par3d train, whose data parallelism is "
                             "its own, not PyTorch FSDP; drop --fsdp")
        if args.recompute == "op":
            raise UsageError("--recompute op with --emit-config: par3d train recomputes every layer, the attention "
                             "core or nothing; use --recompute full, selective or none, or drop --emit-config")
        if args.zero_stage is not None and args.zero_stage > max_zero:
            raise UsageError(f"--zero-stage {args.zero_stage} with --emit-config: par3d train supports ZeRO "
                             f"stages 0 to {max_zero}; use --zero-stage {max_zero} or drop --emit-config")
        if args.dp_replicate is not None and args.dp_replicate > 1:
            raise UsageError(f"--dp-replicate {args.dp_replicate} with --emit-config: par3d train has no HSDP; "
                             "use --dp-replicate 1 or drop --emit-config")
        if args.recompute_layers is not None:
            raise UsageError(f"--recompute-layers {args.recompute_layers} with --emit-config: par3d train "
                             "recomputes every layer or none; drop --recompute-layers or --emit-config")
        if args.cp is not None and args.cp > 1 and not has_cp:
            raise UsageError(f"--cp {args.cp} with --emit-config: par3d train has no context parallelism yet; "
                             f"use --cp 1 or drop --emit-config")
    local = model.seq_len // (args.cp or 1)
    if args.sequence_parallel and args.tp is not None and local % args.tp:
        raise UsageError(f"--sequence-parallel: the {local} tokens per rank (seq_len / cp) are not divisible by "
                         f"--tp {args.tp}; use --no-sequence-parallel or a --seq-len multiple of "
                         f"{args.tp * (args.cp or 1)}")


def _check_v(args: argparse.Namespace, model) -> None:
    """The V schedules' rules, as `par3d train` (config.py) applies them."""
    name = args.schedule
    if args.virtual_stages not in (None, 2):
        raise UsageError(f"--schedule {name} --virtual-stages {args.virtual_stages}: {name} holds two chunks per "
                         f"rank in a V (rank r: stages r and 2p-1-r); use --virtual-stages 2 or omit it")
    if args.pp is not None and args.pp < 2:
        raise UsageError(f"--schedule {name} --pp {args.pp}: a V needs at least two pipeline ranks; use --pp 2 "
                         f"or more, or --schedule 1f1b")
    if args.pp is not None and 2 * args.pp > model.layers + 2:
        raise UsageError(f"--schedule {name} --pp {args.pp}: the V has 2 x pp = {2 * args.pp} chunks and every "
                         f"chunk needs one of the {model.layers} layers (or the embedding or the head alone); use "
                         f"--pp <= {(model.layers + 2) // 2}")


def runtime_support() -> tuple[int, bool]:
    """(highest ZeRO stage, context parallelism?) that `par3d train`'s config accepts, read from
    par3d.config itself, so `--emit-config` follows the runtime as it gains ZeRO-2/3 and CP."""
    import dataclasses

    from par3d.config import ConfigError, ParallelConfig, RunConfig, TrainConfig

    has_cp = any(f.name == "cp" for f in dataclasses.fields(ParallelConfig))
    best = 0
    for z in (1, 2, 3):
        rc = RunConfig(parallel=ParallelConfig(dp=2, zero_stage=z), train=TrainConfig(global_batch=4))
        try:
            rc.validate()
        except ConfigError as e:
            if any("zero_stage" in prob for prob in e.problems):
                break
        best = z
    return best, has_cp


def _run(args: argparse.Namespace) -> int:
    from par3d.plan.cost import Options
    from par3d.plan.models import ModelError, resolve_model
    from par3d.plan.plan_memory import memory_accounting
    from par3d.plan.search import Fixed, Limits, PlanError, search, suggest_fixes

    try:
        model = resolve_model(args.model, args.layers, args.hidden, args.heads, args.seq_len, args.vocab,
                              args.ffn_hidden, args.kv_heads, args.gated_mlp, args.norm, args.tied_embeddings,
                              args.position, args.bias, args.head_dim, args.experts, args.top_k,
                              args.moe_ffn_hidden, args.shared_expert_ffn, args.dense_layers, args.kv_lora_rank,
                              args.q_lora_rank, args.qk_rope_dim, args.v_head_dim, args.mtp_layers,
                              args.router_groups, args.router_group_topk, args.moe_step, args.sliding_window,
                              args.attention_chunk, args.global_every, args.qk_norm, args.router_consecutive,
                              args.global_first, args.moe_load)
    except ModelError as e:
        raise UsageError(str(e)) from None
    apply_framework(args)
    _check_sweep(args)
    if args.pipeline_layout:
        model = _with_layout(model, args)
    elif args.megatron_split:  # the framework cuts the pipeline as Megatron-Core does (stage_layout.megatron_split)
        from dataclasses import replace

        model = replace(model, partition="megatron")
    cluster = _at_count(args, lambda: _cluster(args))
    if args.optimizer == "muon" and args.optimizer_dtype != "fp32":
        raise UsageError(f"--optimizer-dtype {args.optimizer_dtype} with --optimizer muon: the state dtypes set Adam's "
                         "master copy and moments, and Muon keeps an fp32 momentum; drop --optimizer-dtype")
    if args.optimizer == "muon" and args.emit_config:
        raise UsageError("--emit-config with --optimizer muon: par3d train steps Adam only, so its config cannot run "
                         "this plan; drop --emit-config (the plan itself is priced) or --optimizer muon")
    if model.moe and args.emit_config:
        raise UsageError(f"--emit-config with a mixture of experts ({model.experts} experts): par3d train has no "
                         "routed experts, so no config of it can run this model; drop --emit-config (the plan "
                         "itself is priced) or describe a dense model")
    if args.emit_config and model.head_size is None:  # what the runtime cannot build, refused before the search
        from par3d.config import ConfigError, model_config_from_spec

        try:
            model_config_from_spec(model)
        except ConfigError as e:
            raise UsageError(f"--emit-config: {'; '.join(e.problems)}; drop --emit-config (the plan itself is "
                             "priced)") from None
    if model.head_size is not None:  # heads of their own width: priced by the GPU descriptions only
        if args.emit_config:
            raise UsageError(f"--emit-config with head_dim {model.head_dim} (heads x head_dim = {model.q_dim}, not "
                             f"--hidden {model.hidden}): par3d train's attention has hidden / heads channels per "
                             "head; drop --head-dim (or the config.json's head_dim) or --emit-config")
        if cluster.profile is not None:
            raise UsageError(f"head_dim {model.head_dim} (heads x head_dim = {model.q_dim}, not --hidden "
                             f"{model.hidden}) with a calibrated host: its measured block has hidden / heads "
                             "channels per head; plan it on a GPU description, or drop --head-dim")
    _at_count(args, lambda: _check_fixed(args, model, cluster))
    if args.recompute_modules is not None:
        if args.recompute not in (None, "selective"):
            raise UsageError(f"--recompute-modules with --recompute {args.recompute}: named modules are Megatron-Core's "
                             "selective recomputation; use --recompute selective or drop one of the two")
        if args.emit_config:
            raise UsageError("--recompute-modules with --emit-config: par3d train recomputes every layer, the attention "
                             "core or nothing; drop --recompute-modules or --emit-config")
        names = [m.strip() for m in args.recompute_modules.split(",") if m.strip()]
        if not names:
            raise UsageError(f"--recompute-modules {args.recompute_modules!r} names no module; give one or more of "
                             f"{', '.join(RECOMPUTE_MODULES)}, comma-separated, or --recompute none")
        args.recompute = modules_recompute(names)
    fixed = Fixed(args.tp, args.pp, args.dp, args.micro_batch, args.schedule, args.virtual_stages,
                  args.recompute, args.zero_stage, args.sequence_parallel, args.cp,
                  1 if args.emit_config else args.dp_replicate, args.recompute_layers, args.ep, args.etp)
    max_zero, has_cp = runtime_support() if args.emit_config else (3, True)
    limits = Limits(args.max_bubble, args.allow_inter_node_tp, max_zero, args.max_virtual_stages,
                    None if has_cp else 1, block_recompute=not args.emit_config, schedules=args.schedules)
    opts = Options(memory_accounting=args.memory_accounting, memory_headroom=args.memory_headroom,
                   optimizer_dtype=args.optimizer_dtype, ignore_memory=args.ignore_memory)
    args.plan_options = opts
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    if args.gpus_sweep:
        return _sweep(args, model, fixed, limits, opts, show)
    try:
        res = search(model, cluster, args.global_batch, fixed, limits, args.top, args.train_tokens,
                     report_unfit=args.explain, opts=opts, progress=progress_line if show else None)
    except PlanError as e:
        raise UsageError(str(e)) from None
    finally:
        if show:
            print("\r\033[K", end="", file=sys.stderr, flush=True)  # wipe the progress line
    if not res.plans:
        if show:  # each fix offered is searched for (more GPUs, context parallelism, ...): that can take a while
            print("par3d plan: nothing fits; searching for a fix ...", end="", file=sys.stderr, flush=True)
        fixes = suggest_fixes(model, cluster, args.global_batch, fixed, limits, res, opts)
        if show:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
        if args.json:
            u = res.nearest_unfit
            print(json.dumps({"model": model.to_dict(), "hardware": cluster.to_dict(),
                              "global_batch": args.global_batch, "plans": [],
                              "nearest_unfit": u.to_dict() if u is not None else None, "fixes": fixes,
                              "search": {"considered": res.considered, "simulated": res.simulated,
                                         "rejected": dict(res.rejected)}}, indent=2))
        print(no_plan_message(model, cluster, res, opts, fixes), file=sys.stderr)
        return 1
    if args.json:
        evidence = evidence_of(cluster, model.moe)
        out = {"model": model.to_dict(), "hardware": cluster.to_dict(), "global_batch": args.global_batch,
               # the accounting memory.py counted: fp32 gradient reduction keeps fp32 gradients (plan_memory.memory_accounting)
               "memory": {"accounting": memory_accounting(opts, cluster), "optimizer_dtype": opts.optimizer_dtype,
                          "headroom": opts.memory_headroom,
                          "usable_gib": opts.capacity(cluster) / 2**30},
               # each plan with the regimes of the validation set it falls in, and the model's errors there
               # (where the GPU's evidence applies: `regime_evidence_of`)
               "plans": [{**p.to_dict(), "chunk_layers": chunk_layers(model, p), "regimes": regime_evidence_of(cluster, p.choice)}
                         for p in res.plans],
               # the signed errors on the validation set's published runs of this GPU and dtype (None: none)
               "evidence": evidence,
               # how well this model chose among the layouts of published runs (validation_runs.layout_picks; None where
               # the GPU's evidence does not apply), as the ranking line reads it
               "ranking": ranking_evidence_of(cluster),
               # the whole set scored with its rows' software described and with the planner's defaults in its
               # place (evidence.software_figures; None where the GPU's evidence does not apply)
               "software_evidence": software_evidence_of(cluster),
               # how well it read a lower precision's speed-up on runs published in two (validation_runs.precision_pairs;
               # None where the GPU's description is not the catalogue's)
               "precision_evidence": precision_evidence_of(cluster),
               # the --framework whose facts filled the software flags left unset (plan/frameworks.py)
               "framework": args.framework,
               "search": {"considered": res.considered, "simulated": res.simulated,
                          "rejected": dict(res.rejected)}}
        print(json.dumps(out, indent=2))
    else:
        print(render(model, cluster, args, res, explain=args.explain))
    if args.emit_config:
        _emit(args, model, res.plans[0])
    return 0


def _check_sweep(args: argparse.Namespace) -> None:
    """--gpus-sweep and --scale-batch: refuse what a sweep cannot mean, before any search; the checks that need the
    model and the cluster run on the smallest count here and on every count in `_sweep` before its first search."""
    if args.scale_batch and not args.gpus_sweep:
        raise UsageError("--scale-batch: only with --gpus-sweep (it grows the global batch with the swept GPU count)")
    if not args.gpus_sweep:
        return
    for flag, given, why in (("--emit-config", args.emit_config, "a config is one run: plan the count you will run "
                                                                 "with --gpus"),
                             ("--explain", args.explain, "it explains one plan: rerun one count with --gpus"),
                             ("--dp", args.dp, "the data-parallel size follows the GPU count: drop --dp and fix "
                                               "--tp/--cp/--pp instead")):
        if given:
            raise UsageError(f"{flag} with --gpus-sweep: {why}")
    args.gpus = args.gpus_sweep[0]


def _at_count(args: argparse.Namespace, check):
    """Run `check()`; with --gpus-sweep, a refusal names the GPU count it was found at."""
    try:
        return check()
    except UsageError as e:
        if args.gpus_sweep:
            raise UsageError(f"--gpus-sweep at {args.gpus} GPUs: {e}") from None
        raise


def _sweep(args: argparse.Namespace, model, fixed, limits, opts, show: bool) -> int:
    """--gpus-sweep: the best plan at each GPU count (every count's flags checked before the first search), one line
    each, and the scale-pair evidence (`plan_report.sweep_report`)."""
    from par3d.plan.search import PlanError, search

    first, batch0 = args.gpus_sweep[0], args.global_batch
    runs = []
    for n in args.gpus_sweep:
        batch = batch0
        if args.scale_batch:
            if batch0 * n % first:
                raise UsageError(f"--scale-batch: --global-batch {batch0} x {n} / {first} GPUs is not a whole number "
                                 f"of sequences; give a --global-batch that is a multiple of {first}")
            batch = batch0 * n // first
        args.gpus, args.global_batch = n, batch
        cluster = _at_count(args, lambda: _cluster(args))
        _at_count(args, lambda c=cluster: _check_fixed(args, model, c))
        runs.append((n, batch, cluster))
    args.gpus, args.global_batch = first, batch0
    results = []
    for i, (n, batch, cluster) in enumerate(runs, 1):
        if show:
            print(f"\r\033[Kpar3d plan: {n} GPUs ({i}/{len(runs)})", end="", file=sys.stderr, flush=True)
        try:
            res = search(model, cluster, batch, fixed, limits, 1, args.train_tokens, opts=opts)
        except PlanError as e:
            results.append({"gpus": n, "global_batch": batch, "cluster": cluster, "plan": None, "why": str(e),
                            "refused": True})
            continue
        why = None if res.plans else ("no plan fits (" + ", ".join(f"{k}: {v}" for k, v in res.rejected.most_common(3))
                                      + ")")
        results.append({"gpus": n, "global_batch": batch, "cluster": cluster,
                        "plan": res.plans[0] if res.plans else None, "why": why})
    if show:
        print("\r\033[K", end="", file=sys.stderr, flush=True)
    if all(r.get("refused") for r in results) and len({r["why"] for r in results}) == 1:
        # the same refusal at every count is one about the flags, not the counts: refused as without a sweep
        raise UsageError(results[0]["why"])
    print(sweep_report(model, args, results, as_json=args.json))
    return 0 if any(r["plan"] is not None for r in results) else 1


def _emit(args, model, plan) -> None:
    import dataclasses

    from par3d.config import (
        DTYPES,
        ConfigError,
        ParallelConfig,
        RunConfig,
        TrainConfig,
        model_config_from_spec,
        smoke_model,
    )

    c = plan.choice
    par = dict(dp=c.dp, pp=c.pp, tp=c.tp, schedule=c.schedule, microbatches=c.microbatches,
               virtual_stages=c.virtual_stages, zero_stage=c.zero_stage, recompute=c.recompute,
               sequence_parallel=c.sequence_parallel)
    if any(f.name == "cp" for f in dataclasses.fields(ParallelConfig)):
        par["cp"] = c.cp  # the search keeps cp = 1 while the runtime lacks it (runtime_support)
    smoke = bool(getattr(args, "emit_smoke", False))
    split = model.pipeline_split or plan.pipeline_layout  # given, or the planner's round-wise cut (cost.evaluate)
    if split and not smoke:  # the layout priced is the layout run (a smoke test has one layer a chunk)
        par["pipeline_layout"] = list(split)
    dtype = args.dtype if args.dtype in DTYPES else "bf16"
    mc = model_config_from_spec(model)  # the planner's model, architecture and all
    if smoke:
        mc = smoke_model(mc, c.tp, c.pp * c.virtual_stages)
    mb = 1 if smoke else c.micro_batch
    if smoke and c.microbatches > 8:  # a few micro-batches still exercise the schedule
        par["microbatches"] = max(c.pp, 8 // c.pp * c.pp)
    if "zbv_times" in plan.extra:  # the order priced is the order run: zb-v built for the plan's chunk times
        par["zbv_times"] = list(plan.extra["zbv_times"])
    rc = RunConfig(
        model=mc,
        parallel=ParallelConfig(**par),
        train=TrainConfig(global_batch=mb * par["microbatches"] * c.dp, micro_batch=mb,
                          dtype="fp32" if smoke else dtype, **({"steps": 3} if smoke else {})),
        hardware=None if smoke else args.hardware,
    )
    try:
        rc.validate()
    except ConfigError as e:  # pragma: no cover - the search only proposes valid plans
        raise UsageError(f"--emit-config {args.emit_config}: the chosen plan is not a valid config: {e}") from None
    try:
        with open(args.emit_config, "w") as fh:
            fh.write(f"# par3d plan: {plan.choice.label()}\n# predicted step {plan.step_time:.3f} s, "
                     f"{plan.memory.total / 2**30:.1f} GiB/GPU, MFU {plan.mfu:.1%}\n")
            if dtype != args.dtype:
                fh.write(f"# note: planned for --dtype {args.dtype}; par3d train runs {', '.join(DTYPES)}, so "
                         f"the config trains in {dtype}\n")
            if smoke:
                fh.write(f"# smoke test: {model.name}'s architecture and the plan's layout at CPU size "
                         f"(--emit-smoke)\n")
            fh.write(rc.to_toml())
    except OSError as e:
        raise UsageError(f"--emit-config {args.emit_config}: cannot write ({e.strerror}); give a writable path") \
            from None
    print(f"wrote {args.emit_config}", file=sys.stderr)
