"""One mixture-of-experts layer alone, priced against Megatron-LM's own measurements of it (held out).

Megatron-LM's MoE performance regression test (tests/functional_tests/test_cases/common/moe_perf: test_cases.py
describes each case, baseline.json holds its measured forward and backward times; read at NVIDIA/Megatron-LM
d98e8a6, 2026-08) times Megatron-Core's `MoELayer` by itself on one DGX H100 node: 4,096 tokens per rank (sequence
4,096, micro-batch 1), expert parallelism 8, tensor parallelism 1, the input in BF16, CUDA events around the forward
and around the backward, the mean of 20 iterations after 5 warm-ups, load balancing forced, a long GEMM before each
iteration to hide the router's launches.  Two proxies: Mixtral's (h 4,096, 8 experts of 14,336, top-2) and
DeepSeek-V3's (h 7,168, 32 experts of 2,048, top-8, a shared expert of 2,048, sigmoid routing in groups), each with
Transformer Engine's grouped GEMM and the permutation and router fusions, each with the alltoall dispatcher and
the flex dispatcher's two back ends (DeepEP, HybridEP).  `TransformerConfig`'s defaults make the experts plain
GeLU MLPs (no gated unit).

The planner prices the layer as a step would (`cp_ep_comm.choice_layer_times`' "moe" module: the router, the grouped
GEMMs, a shared expert, the routing and activation traffic; plus `cp_ep_comm.ep_exchange`'s dispatch and combine): the
forward that, the backward twice its computation plus its all-to-alls (the step model's convention).  Only the BF16
cases are priced: the FP8 ones run DeepSeek's blockwise recipe (1×128 / 128×128 scales), which par3d does not model.
Nothing here set any constant (docs/planner_rounds.md, issue 12's thirtieth round).  `python -m par3d.plan.moe_layers` prints the
table docs/planner_rounds.md quotes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from .cost import Choice
from .cp_ep_comm import choice_layer_times, ep_exchange
from .hardware import make_cluster
from .models import ModelSpec

SOURCE = "NVIDIA/Megatron-LM d98e8a6, tests/functional_tests/test_cases/common/moe_perf/{test_cases.py,baseline.json}"


@dataclass(frozen=True)
class Case:
    name: str  # the test case's name
    hidden: int
    expert_ffn: int
    experts: int
    top_k: int
    shared_ffn: int
    dispatcher: str  # "alltoall" or "flex" (Megatron-Core's token dispatchers)
    forward_ms: float  # measured (baseline.json)
    backward_ms: float
    route_groups: int = 0  # group-limited routing (test_cases.py's moe_router_num_groups / moe_router_group_topk)
    route_group_topk: int = 0


_MIX = dict(hidden=4096, expert_ffn=14336, experts=8, top_k=2, shared_ffn=0)
_DS = dict(hidden=7168, expert_ffn=2048, experts=32, top_k=8, shared_ffn=2048, route_groups=8, route_group_topk=4)
CASES = (
    Case("mixtral_a2a_tp1ep8_bf16", **_MIX, dispatcher="alltoall", forward_ms=4.3269, backward_ms=7.6843),
    Case("mixtral_deepep_tp1ep8_bf16", **_MIX, dispatcher="flex", forward_ms=4.6356, backward_ms=7.8544),
    Case("mixtral_hybridep_tp1ep8_bf16", **_MIX, dispatcher="flex", forward_ms=4.3426, backward_ms=7.7408),
    Case("deepseek_a2a_tp1ep8_bf16", **_DS, dispatcher="alltoall", forward_ms=7.1192, backward_ms=10.4827),
    Case("deepseek_deepep_tp1ep8_bf16", **_DS, dispatcher="flex", forward_ms=5.6817, backward_ms=9.0551),
    Case("deepseek_hybridep_tp1ep8_bf16", **_DS, dispatcher="flex", forward_ms=5.3908, backward_ms=8.7950),
)


def model_of(case: Case) -> ModelSpec:
    """The proxy as one layer (the attention's heads are the test's 8; only the MoE block is priced)."""
    return ModelSpec(case.name, layers=1, hidden=case.hidden, heads=8, seq_len=4096, vocab=32000,
                     ffn_hidden=case.expert_ffn, experts=case.experts, top_k=case.top_k,
                     moe_ffn_hidden=case.expert_ffn, shared_ffn=case.shared_ffn, gated=False, tied=False,
                     learned_pos=False, bias=False, norm="rms", route_groups=case.route_groups,
                     route_group_topk=case.route_group_topk)


def predict(case: Case) -> tuple[float, float]:
    """(forward, backward) of the MoE block in milliseconds, as the step model prices them on one DGX H100 node."""
    cl = replace(make_cluster("h100-sxm", 8, dtype="bf16"), moe_dispatcher=case.dispatcher)
    c = Choice(tp=1, pp=1, dp=8, micro_batch=1, microbatches=1, zero_stage=1, ep=8)  # one node, EP 8
    model = model_of(case)
    block = dict(choice_layer_times(model, cl, c).modules)["moe"]
    fwd, bwd = ep_exchange(model, cl, c)
    return (block + fwd) * 1e3, (2 * block + bwd) * 1e3


def table() -> str:
    lines = ["| case | dispatcher | forward: measured | predicted | error | backward: measured | predicted | error |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for case in CASES:
        f, b = predict(case)
        lines.append(f"| {case.name} | {case.dispatcher} | {case.forward_ms:.2f} ms | {f:.2f} ms | "
                     f"{f / case.forward_ms - 1:+.0%} | {case.backward_ms:.2f} ms | {b:.2f} ms | "
                     f"{b / case.backward_ms - 1:+.0%} |")
    return "\n".join(lines)


def as_json() -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for case in CASES:
        f, b = predict(case)
        out.append({"case": case.name, "dispatcher": case.dispatcher, "source": SOURCE,
                    "forward_ms": {"measured": case.forward_ms, "predicted": f, "error": f / case.forward_ms - 1},
                    "backward_ms": {"measured": case.backward_ms, "predicted": b, "error": b / case.backward_ms - 1}})
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m par3d.plan.moe_layers",
                                 description="One MoE layer alone, priced against Megatron-LM's measured moe_perf "
                                             "baselines (DGX H100, EP 8, BF16; held out).")
    ap.add_argument("--json", action="store_true", help="print the cases as JSON instead of the markdown table")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    print(json.dumps(as_json(), indent=2) if args.json else table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
