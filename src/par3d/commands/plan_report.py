"""The report of `par3d plan`: the text a plan is rendered as (`render`: the table, the best plan's evidence,
software, regime, ranking, placement, mesh and CP lines, the --explain breakdown), the evidence the --json report
carries (`evidence_of`, `regime_evidence_of`, `ranking_evidence_of`, `software_evidence_of`), the no-plan message,
the search's progress line and the --gpus-sweep report (`sweep_report`, with `scaling_evidence_of`).  commands/plan.py parses the flags, runs the search and prints what this renders.
"""

from __future__ import annotations

import sys

from par3d.plan.compute import LOSS_BYTES
from par3d.plan.frameworks import FRAMEWORKS
from par3d.plan.hardware import FSDP_UNIT_S
from par3d.plan.plan_memory import zbv_kept_factor


def chunk_layers(model, plan) -> list[int]:
    """The layers of each pipeline chunk the plan is priced with, in model order (what --pipeline-layout takes, and
    Megatron-Core's per-stage layer counts): the round-wise cut where the planner chose it (`Plan.pipeline_layout`),
    else the model's own."""
    from par3d.plan.stage_layout import layout

    c = plan.choice
    return list(plan.pipeline_layout or layout(model, c.pp * c.virtual_stages).layers)


def progress_line(done: int, total: int) -> None:
    """The search's progress on one stderr line: a bar over the (tp, cp, pp) layouts, then the finalists' pricing
    (`search.search`'s second phase, simulating the best candidates' schedules), which has no count of its own."""
    width = 30
    fill = width * done // max(total, 1)
    what = "pricing the finalists" if done >= total else "enumerating"
    print(f"\rpar3d plan: [{'#' * fill}{'.' * (width - fill)}] {done}/{total} layouts, {what}", end="",
          file=sys.stderr, flush=True)


def no_plan_message(model, cluster, res, opts, fixes: list[str]) -> str:
    from par3d.plan.hardware import GiB

    why = ", ".join(f"{k}: {v}" for k, v in res.rejected.most_common()) or "no candidate passed the rules"
    lines = [f"par3d plan: no configuration of {model.name} on {cluster.gpus} x {cluster.device.name} satisfies "
             f"the constraints (rejected: {why})."]
    if res.nearest_unfit is not None:
        u = res.nearest_unfit
        lines.append(f"  nearest to fitting: {u.choice.label()} needs {u.memory.total / GiB:.1f} GiB > "
                     f"{opts.capacity(cluster) / GiB:.1f} GiB usable ({cluster.device.mem_bytes / GiB:.0f} GiB less "
                     f"{opts.memory_headroom:.0%} headroom)")
    lines.append("  fix: " + lines_join(fixes))
    return "\n".join(lines)


def lines_join(fixes: list[str]) -> str:
    return "\n       ".join(fixes)


# ---- text output ---------------------------------------------------------------------------------

def _ms(x: float) -> str:
    return f"{x * 1e3:.2f} ms"


def _seq_note(args) -> str:
    """A config.json gives its longest position as the sequence length; say so where no --seq-len chose it."""
    from par3d.plan.models import is_config_path

    if getattr(args, "seq_len", None) is None and args.model and is_config_path(args.model):
        return " (config.json's max_position_embeddings; --seq-len sets the training length)"
    return ""


def render(model, cluster, args, res, explain: bool = False) -> str:
    from dataclasses import replace

    from par3d.plan.choice import fsdp_unit_priced
    from par3d.plan.hardware import GB, TFLOPS, GiB, describe

    out = [f"model:    {model.summary()}",
           f"cluster:  {describe(cluster)}",
           f"batch:    {args.global_batch} sequences x {model.seq_len} tokens per step" + _seq_note(args),
           *([f"optimizer: Muon ({cluster.muon_tp_mode} over TP; 5 Newton-Schulz steps per matrix in the optimizer "
              "step; the embedding and output layer on Adam)"] if cluster.optimizer == "muon" else []),
           *([f"optimizer: {cluster.offload_optimizer:.0%} of the optimizer states in host memory, stepped there "
              "(a lower bound of that step's time; never checked against a measured run)"]
             if cluster.offload_optimizer else []),
           *(["p2p:      each pipeline send holds its GPU until delivered ("
              + ("every schedule" if cluster.p2p_blocking == "all" else "the 1F1B schedule; interleaved ones overlap")
              + ", --p2p-blocking)"] if cluster.p2p_blocking != "none" else []),
           f"searched: {res.considered} configurations, simulated {res.simulated}; rejected: "
           + (", ".join(f"{k} ({v})" for k, v in res.rejected.most_common()) or "none"),
           "",
           f"{'#':>2} {'tp':>3} {'cp':>3} {'pp':>3} {'dp':>4}{'  ep etp' if model.moe else ''} {'mb':>3} {'m':>5} "
           f"{'schedule':>11} {'v':>2} {'recomp':>10} "
           f"{'zero':>4} {'sp':>3} {'GiB':>6} {'step s':>8} {'tok/s':>9} {'TF/s':>6} {'MFU':>6} {'bubble':>6}"]
    for i, p in enumerate(res.plans, 1):
        c = p.choice
        dp = c.dp_split if c.dp_replicate > 1 else str(c.dp)
        ep = f" {c.ep:>3} {c.etp:>3}" if model.moe else ""  # a mixture of experts: expert-(tensor-)parallel sizes
        out.append(f"{i:>2} {c.tp:>3} {c.cp:>3} {c.pp:>3} {dp:>4}{ep} {c.micro_batch:>3} {c.microbatches:>5} {c.schedule:>11} "
                   f"{c.virtual_stages:>2} {c.recompute_label:>10} {c.zero_stage:>4} {'on' if c.sequence_parallel else 'off':>3} "
                   f"{p.memory.total / GiB:>5.1f}{' ' if p.fits else '!'} {p.step_time:>8.3f} {p.tokens_per_s:>9.0f} "
                   f"{p.model_tflops_per_gpu:>6.1f} {p.mfu:>6.1%} {p.bubble_fraction:>6.1%}")
    best = res.plans[0]
    out.append("")
    if not all(p.fits for p in res.plans):
        out.append(f"!:        over the {args.plan_options.capacity(cluster) / GiB:.1f} GiB usable (--ignore-memory "
                   "ranks them anyway: memory.py says they do not fit)")
    out.append(f"best: {best.choice.label()}: {best.step_time:.3f} s/step, {best.tokens_per_s:,.0f} tokens/s, "
               f"MFU {best.mfu:.1%}, {best.days_to_train:.1f} days for {args.train_tokens:.3g} tokens")
    if best.choice.pp > 1:  # the cut the plan is priced with, in the form --pipeline-layout takes
        how = ("as --pipeline-layout gives" if model.pipeline_split else
               "the round-wise cut, faster here than the partition's own: pass it to par3d train as --pipeline-layout"
               if best.pipeline_layout else "the planner's partition; --pipeline-layout sets one")
        out.append(f"layout:   layers per pipeline chunk {','.join(map(str, chunk_layers(model, best)))} ({how})")
    if "zbv_times" in best.extra:  # the order priced is the one built for these chunk times (cost.zbv_times)
        _, bi, bw, *held = best.extra["zbv_times"]
        more = zbv_kept_factor(model, cluster, best.choice, getattr(args, "plan_options", None))
        kept = ""
        if more > 1:
            kept = (f", a chunk's BI keeping {more:.3g} times its forward's activations for its BW (the memory cap "
                    "counts it as 1, the memory count in full)")
        elif held:
            kept = f", a chunk's BI keeping {held[0]:g} of its activations for its BW (the memory cap counts it)"
        if len(held) > 1:
            kept += f", the head chunk's {held[1]:g} chunks' forwards (with the output layer's input and logits' gradient)"
        out.append(f"order:    zb-v built for chunk times F:BI:BW = 1:{bi:g}:{bw:g}{kept}, as the Zero Bubble authors' "
                   f"runtime builds it from profiled times; par3d train runs this order with --zbv-times "
                   f"{','.join(f'{x:g}' for x in best.extra['zbv_times'])} "
                   "(--emit-config writes it), par3d simulate draws it with --tf 1 --tb "
                   f"{bi:g} --tw {bw:g}{f' --held {held[0]:g}' if held else ''}"
                   f"{f' --head-held {held[1]:g}' if len(held) > 1 else ''}")
    out.append(_evidence_line(cluster, model.moe))
    out += _precision_lines(cluster, model.moe)
    out += _software_lines(cluster, getattr(args, "framework", "par3d"))
    out += _schedule_lines(best.choice.schedule, getattr(args, "framework", "par3d"), getattr(args, "schedules", None))
    if model.moe and getattr(args, "cuda_graphs", "full_iteration") == "full_iteration":
        out.append("note:     priced as whole-iteration CUDA graphs run it (no MoE host floor); a Megatron-Core run "
                   "without them waits for its host each MoE layer: --cuda-graphs partial|none (docs/planner.md §6)")
    if model.local_attention:  # (ModelSpec.attention_spans) no run of the validation set attends locally
        out.append("note:     local attention (chunks or a sliding window past the sequence) is priced as the work it "
                   "does; no published run of it is in the validation set (docs/planner.md §2)")
    out += _regime_lines(cluster, best.choice)
    out += _ranking_lines(cluster, res.plans)
    c = best.choice
    if c.zero_stage == 3 and cluster.zero3_unit == "layer" and not cluster.fsdp \
            and fsdp_unit_priced(replace(cluster, fsdp=True), c):  # a ZeRO-3 plan --fsdp would price otherwise
        out.append(f"note:     ZeRO-3 priced as Megatron-FSDP runs it; under PyTorch FSDP (torchtitan, llm-foundry, "
                   f"fms-fsdp) each layer costs {FSDP_UNIT_S * 1e3:g} ms more per micro-batch: add --fsdp")
    if not explain:
        return "\n".join(out)
    # -- the breakdown --
    b = best.breakdown
    out += ["", "step time breakdown (busiest pipeline rank; sums to the step time):"]
    for k in ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble", "dp_comm", "optimizer",
              "stragglers", "overhead", "offload", "host"):
        if k in b:
            out.append(f"  {k:<10} {b[k]:>9.3f} s  {b[k] / best.step_time:>6.1%}")
    if "host" in b:
        out.append("  (host: the MoE layers waiting for the host to issue their kernels, Megatron-Core without "
                   "whole-iteration CUDA graphs: --cuda-graphs; docs/planner.md §6)")
    if "stragglers" in b:
        out.append(f"  (stragglers: the slowest of {best.choice.gpus:,} GPUs sets the pace, their step times spread "
                   f"{cluster.step_spread:.1%}: --straggler-cv)")
    if b.get("dp_comm") and c.zero_stage < 3 and cluster.hier and cluster.overlap_grad_reduce:
        from par3d.plan.dp_tail import dp_bucket

        size, chunked = dp_bucket(cluster, c)
        later = "; later virtual chunks one bucket each" if chunked and c.virtual_stages > 1 else ""
        given = cluster.dp_bucket_params is not None
        how = (f"buckets of {size / 1e6:,.0f}M parameters (Megatron-Core's max(40M, 1M x DP x CP){later})"
               if not given and size > 0
               else f"buckets of {size / 1e6:,.0f}M parameters (--dp-bucket-params{later})" if size > 0
               else "one bucket per layer")
        out.append(f"  (dp_comm: gradients reduced behind the backward in {how}; what the last bucket leaves after "
                   f"the backward is exposed: --dp-bucket-params)")
    if fsdp_unit_priced(cluster, c):
        from par3d.plan.stage_layout import rank_shapes

        units = max(sum(s.layers) for s in rank_shapes(model, c.tp, c.pp, c.virtual_stages, c.schedule))
        out.append(f"  (dp_comm holds PyTorch FSDP's unit cost: {units} layers x {c.microbatches} micro-batches x "
                   f"{cluster.fsdp_unit_s * 1e3:g} ms = {units * c.microbatches * cluster.fsdp_unit_s:.3f} s: --fsdp)")
        from par3d.plan.parallel_comm import fsdp2_copy_out

        copy = fsdp2_copy_out(model, cluster, c, units, 0)
        if copy > 0:  # after each gather: forward and backward per micro-batch, once a step under PP
            times = 1 if c.pp > 1 else 2 * c.microbatches
            out.append(f"  (and FSDP2's copy-out of each gathered layer: {units} layers x {times} gathers x "
                       f"{copy * 1e3:.2f} ms = {units * times * copy:.3f} s at HBM rate: --fsdp-version)")
    if best.choice.pp > 1:
        out += ["", _placement_line(best.choice)]
    mem = best.memory.gib()
    cap = cluster.device.mem_bytes / GiB
    out += ["", f"memory on the heaviest GPU (pipeline rank {best.memory_rank}), GiB of {cap:.0f}:"]
    out += [f"  {k:<12} {mem[k]:>8.2f}" for k in ("weights", "grads", "optimizer", "activations", "other", "total")]
    states = best.memory.states
    out.append(f"  model states {states / GiB:.2f} GiB = {states / 1e9:.2f} GB (decimal, the seed's unit)")
    out.append(f"  throughput: model {best.model_tflops_per_gpu:.1f} TFLOP/s/GPU, hardware (with recompute) "
               f"{best.hardware_tflops_per_gpu:.1f} TFLOP/s/GPU, MFU {best.mfu:.1%}, simulated bubble "
               f"{best.bubble_fraction:.1%} of wall time")
    # -- the seed's accounting at this plan's micro-batch and tp --
    from par3d.plan.compute import layer_times, loss_time, loss_vocab, roofline
    from par3d.plan.cost import layer_accounting
    from par3d.plan.parallel_comm import local_model

    c = best.choice
    la = layer_accounting(local_model(model, c.cp), cluster, c.micro_batch, c.tp)
    dev = cluster.device
    eff = dev.peak(cluster.dtype) * dev.efficiency
    seed_like = abs(la.gemm_flops - la.seed_flops) <= 0.005 * la.seed_flops  # the seed's GPT layer (§4.2)
    out += ["", f"per-layer accounting, forward, one micro-batch of T = {la.tokens} tokens"
                + (f" (this rank's seq_len/cp = {model.seq_len}/{c.cp} per sequence)" if c.cp > 1 else "")
                + f", tp = {c.tp} (seed §4.2):",
            (f"  GEMM FLOPs 24·T·h²/tp = {la.gemm_flops / 1e9:.0f} GFLOP/GPU" if seed_like else
             f"  GEMM FLOPs of its projections and {'routed experts' if model.moe else 'MLP'} = "
             f"{la.gemm_flops / 1e9:.0f} GFLOP/GPU (the seed's 24·T·h²/tp, for MHA and a 4h MLP: "
             f"{la.seed_flops / 1e9:.0f})")
            + f" -> {_ms(la.flat_time)} at "
            f"{eff / TFLOPS:.0f} TFLOP/s; with the attention core, roofline and waves: {_ms(la.model_time)}",
            f"  TP: 2 all-reduces of T·h·2 B = {la.message_bytes / 1e6:.1f} MB; ring traffic "
            f"{la.ring_bytes / 1e6:.0f} MB/GPU -> {_ms(la.tp_beta)} + α {_ms(la.tp_alpha)} = {_ms(la.tp_time)}"
            f" ({la.ratio:.0%} of the GEMM time; {la.tp_time / (la.tp_time + la.flat_time):.0%} of the layer)"
            + _mesh_note(cluster, c.tp),
            f"  the same TP over the inter-node link ({cluster.inter.beta / GB:g} GB/s): {_ms(la.tp_slow)} per "
            f"layer; layer {_ms(la.flat_time + la.tp_time)} -> {_ms(la.flat_time + la.tp_slow)} "
            f"({la.slowdown:.1f}x slower)",
            f"  per micro-batch over {la.layers} layers (seed §4.5): compute {la.layers * la.flat_time * 1e3:.0f} ms,"
            f" TP bandwidth term {la.layers * la.tp_beta * 1e3:.0f} ms "
            f"({la.tp_beta / (la.tp_beta + la.flat_time):.0%}), with α {la.layers * la.tp_time * 1e3:.0f} ms "
            f"({la.tp_time / (la.tp_time + la.flat_time):.0%})"]
    local = local_model(model, c.cp)  # the sequence one rank holds (its CP block)
    if cluster.flash:  # the attention kernel as the step prices it (benchmarked share × in-step discount, §1)
        core = layer_times(local, dev, cluster.dtype, c.micro_batch, c.tp, c.sequence_parallel, True).core
        block = f" (this rank's own block; the ring adds {c.cp - 1} more)" if c.cp > 1 else ""
        out.append(f"  attention core (FlashAttention, the causal half of 4·T·s·h/tp){block}: {_ms(core)} per layer at "
                   f"{dev.attn_share(local.seq_len):.1%} of bf16 peak in a step = "
                   f"{dev.attn_benchmarked(local.seq_len):.1%} benchmarked × {dev.attn_sustain:.3f} kept "
                   f"(docs/planner.md §1)" + (" -- in FP8: cuDNN's measured FP8/BF16 speed-up included (§4)"
                                              if cluster.fp8_attention else ""))
    if dev.kernel_model == "table":  # the loss as the step prices it: bytes per logit by its implementation (§4)
        gathered = cluster.cross_entropy == "gathered"  # the logits gathered to every TP rank: all V on each
        logits = la.tokens * loss_vocab(model.vocab, c.tp, cluster.cross_entropy)
        loss = loss_time(local, dev, c.micro_batch, c.tp, cluster.cross_entropy)
        out.append(f"  loss (last stage; --cross-entropy {cluster.cross_entropy}): {LOSS_BYTES[cluster.cross_entropy]:g} B "
                   f"per logit x T·V{'' if gathered else '/tp'} = {logits / 1e6:.0f}M logits -> {_ms(loss)} per "
                   "micro-batch, forward and "
                   f"backward, at {dev.mem_eff:.0%} of HBM (docs/planner.md §4)")
    if c.cp > 1:
        out.append(_cp_line(model, cluster, c))
    from par3d.plan.compute import layer_gemms

    first = "expert_in" if model.moe else "mlp_in"  # the MLP's first GEMM (a mixture of experts': one routed expert's)
    g = next(x for x in layer_gemms(local, c.micro_batch, c.tp, c.ep, c.sequence_parallel, c.etp) if x.name == first)
    r = roofline(replace(g, batch=1), dev, cluster.gemm_dtype)  # MXFP8's / NVFP4's GEMMs at their own rate and peak
    what = (f"one routed expert's first GEMM ({g.batch} expert{'s' if g.batch > 1 else ''} on this rank, one grouped GEMM)" if model.moe else
            "the MLP's first GEMM" + (" (gate and up)" if model.gated else ""))
    out.append(f"  roofline of {what} M={g.m} K={g.k} N={g.n} (seed §4.4, {cluster.gemm_dtype}): intensity "
               f"{r.intensity:.0f} FLOP/B vs balance {r.balance:.0f} -> {r.bound}-bound, attainable "
               f"{r.attainable / TFLOPS:.0f} TFLOP/s ({r.fraction_of_peak:.0%} of peak), wave efficiency "
               f"{r.wave_eff:.0%}")
    # -- why it wins --
    from par3d.plan.search import best_per_layout

    out += ["", "why this plan wins:"]
    for i, p in enumerate(res.plans[1:4], 2):
        out.append(f"  vs #{i} {p.choice.label()}: +{p.step_time - best.step_time:.3f} s"
                   + _diff(best, p))
    layouts = best_per_layout(model, cluster, res, train_tokens=args.train_tokens,
                              opts=getattr(args, "plan_options", None))
    if layouts:
        out.append("  best plan of each (tp, cp, pp, dp) layout (lowest bound, simulated):")
        for p in layouts:
            mark = "  <- winner's layout" if (p.choice.tp, p.choice.cp, p.choice.pp, p.choice.dp) == \
                (c.tp, c.cp, c.pp, c.dp) else ""
            out.append(f"    {p.choice.label()}: {p.step_time:.3f} s, {p.memory.total / GiB:.1f} GiB, "
                       f"bubble {p.bubble_fraction:.1%}" + (_diff(best, p) if not mark else "") + mark)
    u = res.fastest_unfit
    if u is not None:
        out.append(f"  faster but does not fit: {u.choice.label()}: {u.step_time:.3f} s needs "
                   f"{u.memory.total / GiB:.1f} GiB > {cap:.0f} GiB")
    return "\n".join(out)


def evidence_of(cluster, moe: bool = False) -> dict | None:
    """How this model did on the published runs of the cluster's GPU and dtype (evidence.evidence_for; of
    mixtures of experts where `moe`), for catalogue GPUs priced by the table model as the validation set prices
    them; None otherwise."""
    from par3d.plan.evidence import evidence_for

    if not _catalogue_description(cluster):
        return None
    return evidence_for(cluster.device.name, cluster.precision, moe)


def _catalogue_description(cluster) -> bool:
    """Whether the cluster's GPU is the catalogue's description, up to the attention kernel (`--attention-kernel`,
    which rows set too): a hardware file's own GEMM table or a flat --efficiency model is not what the validation set
    scored (Device compares by identity, so field by field)."""
    from dataclasses import fields

    from par3d.plan.hardware import DEVICES

    dev, base = cluster.device, DEVICES.get(cluster.device.name)
    return not (cluster.profile is not None or base is None or dev.kernel_model != "table" or any(
        getattr(dev, f.name) != getattr(base, f.name) for f in fields(base) if f.name not in ("attn_eff", "attn_curve")))


def precision_evidence_of(cluster) -> dict | None:
    """How well this model read the speed-up of a lower precision on runs published in two (evidence.precision_evidence,
    every GPU's), where the cluster's GPU is the catalogue's description; None otherwise."""
    from par3d.plan.evidence import precision_evidence

    return precision_evidence() if _catalogue_description(cluster) else None


def _precision_lines(cluster, moe: bool) -> list[str]:
    """Under a plan in a precision below BF16: the precision pairs of this GPU (and of this kind of model) and of the
    whole set -- whether to trust the plan's gain over BF16."""
    from par3d.plan.evidence import evidence_dtype

    dtype = evidence_dtype(cluster.precision)
    ev = precision_evidence_of(cluster)
    if dtype == "bf16" or ev is None:
        return []
    kind = f"{cluster.device.name} bf16→{dtype}" + (" moe" if moe else "")
    mine = ev["by_kind"].get(kind)
    here = (f"on {mine['pairs']} published runs of {cluster.device.name} measured in bf16 and {dtype}"
            f"{' (mixtures of experts)' if moe else ''}, this model's {dtype} speed-up was within ±5 % of the measured "
            f"in {mine['within_5pct']} (median {mine['median_signed_pct']:+.1f} %; positive: more gain predicted than "
            "measured)" if mine else f"no published run of {cluster.device.name} in bf16 and {dtype}"
            f"{' (a mixture of experts)' if moe else ''} is in the validation set")
    return [f"precision: {here}; over every GPU, {ev['within_5pct']} of {ev['pairs']} runs published in two "
            f"precisions (no gain: {ev['no_gain_within_5pct']}, the peak ratio: {ev['peak_within_5pct']}) — "
            "docs/planner.md §9"]


def scaling_evidence_of(cluster) -> dict | None:
    """How well this model read per-GPU throughput at two GPU counts of one published run (evidence.scaling_evidence:
    the scale pairs, every GPU's), where the cluster's GPU is the catalogue's description; None otherwise."""
    from par3d.plan.evidence import scaling_evidence

    return scaling_evidence() if _catalogue_description(cluster) else None


def sweep_report(model, args, results: list[dict], as_json: bool = False) -> str:
    """`par3d plan --gpus-sweep`: the best plan at each GPU count (`results`: gpus, global_batch, cluster, plan or
    None, why), its per-GPU throughput against the smallest count's that has a plan, and the scale-pair evidence --
    as a table, or as JSON."""
    import json

    base = next((r["plan"].tokens_per_s / r["gpus"] for r in results if r["plan"] is not None), None)
    ev = scaling_evidence_of(results[0]["cluster"])

    def vs_base(r: dict) -> float | None:
        return None if r["plan"] is None or base is None else r["plan"].tokens_per_s / r["gpus"] / base

    if as_json:
        return json.dumps({
            "model": model.to_dict(), "hardware": results[0]["cluster"].to_dict(), "scale_batch": args.scale_batch,
            "sweep": [{"gpus": r["gpus"], "global_batch": r["global_batch"],
                       "plan": r["plan"].to_dict() if r["plan"] is not None else None,
                       "tokens_per_s_per_gpu": r["plan"].tokens_per_s / r["gpus"] if r["plan"] is not None else None,
                       "per_gpu_vs_first": vs_base(r), "why": r["why"]} for r in results],
            # the scale pairs of the validation set (validation_runs.scale_stats; None where the GPU is not the
            # catalogue's description)
            "scaling_evidence": ev}, indent=2)
    c0 = results[0]["cluster"]
    batch = ("grown with the GPU count (--scale-batch)" if args.scale_batch
             else f"{args.global_batch} sequences at every count")
    out = [f"par3d plan: {model.name} on {c0.device.name} {c0.precision}, the best plan at each GPU count; global "
           f"batch {batch}", "",
           f"| GPUs | global batch | best plan | step | tokens/s per GPU | per GPU vs first plan | MFU | memory/GPU | days for "
           f"{args.train_tokens:.3g} tokens | GPU-hours per 1B tokens |",
           "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        p = r["plan"]
        if p is None:
            out.append(f"| {r['gpus']:,} | {r['global_batch']:,} | {r['why']} | | | | | | | |")
            continue
        out.append(f"| {r['gpus']:,} | {r['global_batch']:,} | {p.choice.label()} | {p.step_time:.3f} s | "
                   f"{p.tokens_per_s / r['gpus']:,.0f} | {vs_base(r):.1%} | {p.mfu:.1%} | "
                   f"{p.memory.total / 2**30:.1f} GiB | {p.days_to_train:,.1f} | "
                   f"{1e9 / (p.tokens_per_s / r['gpus']) / 3600:,.0f} |")
    out.append("")
    if ev is None:
        out.append("scaling: no evidence for this description (a hardware file or a flat --efficiency model is not "
                   "the catalogue description the validation set scored: docs/planner.md §9)")
    else:
        moe = (f"; read a mixture of experts' fall at scale as a floor: mixtures of experts {ev['moe_within_5pct']} of "
               f"{ev['moe']}, mostly predicted to lose less than measured" if model.moe else "")
        kind, what = ("weak", "the global batch grown with the GPUs") if args.scale_batch else \
            ("strong", "the global batch fixed")
        out.append(f"scaling: on {ev['pairs']} published pairs (one run at two GPU counts, its layout alike) this "
                   f"model's per-GPU scaling was within ±5 % of the measured in {ev['within_5pct']} (dense "
                   f"{ev['dense_within_5pct']} of {ev['dense']}); holding per-GPU throughput flat, "
                   f"{ev['flat_within_5pct']}; with {what}, as here: {ev[kind + '_within_5pct']} of {ev[kind]} "
                   f"(flat: {ev[kind + '_flat_within_5pct']}){moe} — docs/planner.md §9")
    return "\n".join(out)


def _evidence_line(cluster, moe: bool = False) -> str:
    from par3d.plan.evidence import evidence_for

    ev = evidence_of(cluster, moe)
    what = f"{cluster.device.name} {cluster.precision}" + (" mixture-of-experts" if moe else "")
    if ev is None:
        if evidence_for(cluster.device.name, cluster.precision, moe) is not None:  # rows exist, for another description
            return ("evidence: none for this description (a hardware file or a flat --efficiency model is not the "
                    "catalogue description the validation set scored: docs/planner.md §9)")
        return f"evidence: no published run of {what} is in the validation set (docs/planner.md §9)"
    return (f"evidence: on {ev['rows']} published runs of {what} this model's error "
            f"was {ev['min_error_pct']:+.1f} … {ev['max_error_pct']:+.1f} % (median {ev['median_error_pct']:+.1f} %; "
            f"{ev['within_10pct']} within ±10 %; positive: predicted faster than measured) — docs/planner.md §9")


def regime_evidence_of(cluster, c) -> list[dict]:
    """The validation regimes (evidence.REGIMES) a plan falls in, with the model's errors there: only where
    the GPU's evidence applies (`evidence_of`: the catalogue description the set was priced with)."""
    from par3d.plan.evidence import regime_evidence

    return regime_evidence(c, cluster) if evidence_of(cluster) is not None else []


def ranking_evidence_of(cluster) -> dict | None:
    """How well this model chose among published runs' layouts (evidence.ranking_evidence): only where the GPU's
    evidence applies, as `regime_evidence_of`."""
    from par3d.plan.evidence import ranking_evidence

    return ranking_evidence() if evidence_of(cluster) is not None else None


def software_evidence_of(cluster) -> dict | None:
    """The validation set scored with its rows' software facts and without them (evidence.software_evidence): only
    where the GPU's evidence applies, as `regime_evidence_of`."""
    from par3d.plan.evidence import software_evidence

    return software_evidence() if evidence_of(cluster) is not None else None


def software_summary(cluster) -> str:
    """The software facts a plan is priced with, in words: what a framework does that the model prices and a flag
    sets (validation.SOFTWARE_FIELDS's commonest; the attention kernel is on the cluster line)."""
    grads = ("fp32" if cluster.grad_reduce_fp32 else "fp32, cast from bf16" if cluster.grad_reduce_cast
             else "fp16" if cluster.dtype == "fp16" else "bf16")
    sends = {"none": "pipeline sends posted", "1f1b": "1F1B's pipeline sends blocking",
             "all": "pipeline sends blocking"}[cluster.p2p_blocking]
    how = "all-reduced (ZeRO-1 too)" if cluster.zero1_all_reduce else "reduced"
    return (f"{sends}, gradients {how} in {grads} "
            f"{'behind' if cluster.overlap_grad_reduce else 'after'} the backward, ZeRO's parameter gathers "
            f"{'behind compute' if cluster.overlap_param_gather else 'exposed'}, cross-entropy {cluster.cross_entropy}, "
            f"TP communication {'overlapped' if cluster.tp_comm_overlap else 'exposed'}")


def _software_lines(cluster, framework: str = "par3d") -> list[str]:
    """What the plan assumes the training software does, and -- where the GPU's evidence applies -- how much the
    validation set's figures owe to stating it (docs/planner.md section 9, forty-fourth round)."""
    named = framework != "par3d"
    out = [f"software: {'--framework ' + framework + ': ' if named else ''}{software_summary(cluster)} "
           + ("(--framework names the software that will run the plan: "
              f"{', '.join(n for n in FRAMEWORKS if n != 'par3d')}; or say what it does: " if not named else "(")
           + "--p2p-blocking, --grad-reduce-in-fp32, --grad-reduce-cast, --zero1-all-reduce, "
           "--no-overlap-grad-reduce, --no-overlap-param-gather, --cross-entropy, --tp-comm-overlap)"]
    ev = software_evidence_of(cluster)
    if ev is not None:
        d, u = ev["software/described"], ev["software/defaults"]
        f = ev.get("software/framework")
        out.append(f"          the published runs priced from their model, cluster and layout alone (every such "
                   f"flag at its default): {u['within_10pct']} of {u['rows']} within ±10 % (median |error| "
                   f"{u['median_abs_error_pct']:.1f} %)"
                   + (f"; with only their framework named: {f['within_10pct']} ({f['median_abs_error_pct']:.1f} %)"
                      if f is not None else "")
                   + f"; with each run's software stated: {d['within_10pct']} "
                   f"({d['median_abs_error_pct']:.1f} %) — docs/planner.md §9")
    return out


def _schedule_lines(schedule: str, framework: str = "par3d", schedules: tuple[str, ...] | None = None) -> list[str]:
    """Where the best plan's pipeline schedule is one some frameworks lack (a zero-bubble schedule, which the search
    may pick when neither --framework nor --schedules restricts it): which lack it, and how to keep to theirs."""
    if framework != "par3d" or schedules is not None:
        return []
    lack = [f"{n} ({', '.join(fw.schedules)})" for n, fw in FRAMEWORKS.items()
            if fw.schedules is not None and schedule not in fw.schedules]
    if not lack:
        return []
    return [f"note:     {schedule} is a schedule par3d train runs; {', '.join(lack)} do not have it: --framework NAME "
            "or --schedules LIST keeps the search to a framework's schedules"]


def _regime_lines(cluster, c) -> list[str]:
    return [f"caveat: on {ev['rows']} published runs with {ev['rule']} this model's error was "
            f"{ev['min_error_pct']:+.1f} … {ev['max_error_pct']:+.1f} % (median {ev['median_error_pct']:+.1f} %; "
            f"{ev['within_10pct']} within ±10 %): read this plan's speed as likely "
            f"{'optimistic' if float(ev['median_error_pct']) > 0 else 'pessimistic'} — docs/planner.md §9"
            for ev in regime_evidence_of(cluster, c)]


def _layout_of(c) -> tuple:
    """The fields a team changes to try another layout (what the published layout trials varied).  Not the ZeRO
    stage or sequence parallelism: on one layout those trade memory for time the table already shows."""
    return (c.tp, c.cp, c.pp, c.dp, c.dp_replicate, c.ep, c.etp, c.micro_batch, c.schedule, c.virtual_stages,
            c.recompute, c.recompute_layers)


def _ranking_lines(cluster, plans) -> list[str]:
    """Where the nearest plan of another layout (`_layout_of`) is nearer the best plan than the model's measured
    regret when choosing among published layouts (validation_runs.layout_picks), a line saying the two are a tie at this
    model's resolution -- only where the GPU's evidence applies (`evidence_of`)."""
    ev = ranking_evidence_of(cluster)
    if ev is None or len(plans) < 2:
        return []
    best = _layout_of(plans[0].choice)
    rank, other = next(((i, p) for i, p in enumerate(plans[1:], 2) if _layout_of(p.choice) != best), (0, None))
    if other is None:
        return []
    gap = other.step_time / plans[0].step_time - 1
    if 100 * gap >= float(ev["mean_regret_pct"]):
        return []
    c = other.choice
    what = (f"tp {c.tp} cp {c.cp} pp {c.pp} dp {c.dp}, mb {c.micro_batch}, {c.schedule}"
            + (f" v={c.virtual_stages}" if c.virtual_stages > 1 else "") + f", recompute {c.recompute}")
    return [f"ranking:  #{rank} ({what}) is {gap:.1%} slower here; on {ev['runs']} published runs measured at three "
            f"or more layouts this model's pick measured a mean {ev['mean_regret_pct']} % slower than the fastest "
            f"({ev['pick_fastest']} of {ev['runs']} the fastest): layouts this close are a tie to it — time both "
            f"(docs/planner.md §9)"]


def _placement_line(c) -> str:
    """Which stages each pipeline rank holds, as the schedule places them (round-robin or the V)."""
    from par3d.plan.stage_layout import rank_stage_lists

    lists = rank_stage_lists(c.schedule, c.pp, c.virtual_stages)
    shown = [f"rank {r}: stages {', '.join(map(str, st))}" for r, st in enumerate(lists[:4])]
    more = f"; ... rank {c.pp - 1}: stages {', '.join(map(str, lists[-1]))}" if c.pp > 4 else ""
    kind = ("the V: rank r holds stages r and 2p-1-r, so rank 0 holds the embedding and the head"
            if lists[0][-1] == len(lists) * c.virtual_stages - 1 and c.pp > 1 else "round-robin")
    return f"pipeline placement ({c.schedule}, {kind}): " + "; ".join(shown) + more


def _mesh_note(cluster, tp: int) -> str:
    """On a fully connected mesh (AMD's Infinity Fabric) a TP group inside a node uses only the links between its
    members (hardware.mesh_share): say so beside the TP accounting."""
    from par3d.plan.hardware import GB, XGMI_LINKS, mesh_share

    share = mesh_share(cluster.intra.name, tp)
    if tp <= 1 or share >= 1.0 or tp > cluster.gpus_per_node:
        return ""
    return (f"; on the Infinity Fabric mesh tp {tp} uses {tp - 1} of each GPU's {XGMI_LINKS} links, "
            f"{cluster.intra.beta * share / GB:g} of {cluster.intra.beta / GB:g} GB/s")


def _cp_line(model, cluster, c) -> str:
    """The ring attention of one layer: K/V block, hops, the attention that hides them."""
    from par3d.plan import comm
    from par3d.plan.cp_ep_comm import choice_layer_times, cp_exchange
    from par3d.plan.hardware import GB
    from par3d.plan.memory import ACT_BYTES
    from par3d.plan.parallel_comm import links

    link = links(cluster, c).cp
    kv = c.micro_batch * (model.seq_len // c.cp) * 2 * model.kv_dim_per_rank(c.tp) * ACT_BYTES[cluster.dtype]
    where = 'inside a node' if link is cluster.intra else 'across nodes'
    if cluster.cp_comm == "all-gather":  # Llama 3's CP: gather all K/V, exposed
        from par3d.plan.cp_ep_comm import cp_all_gather

        ag, rs = cp_all_gather(model, cluster, c)
        return (f"  CP all-gather (cp = {c.cp}, {where}): K/V of all {model.seq_len} tokens "
                f"{kv * c.cp / 1e6:.1f} MB gathered per layer forward ({_ms(ag)}), dK/dV reduce-scattered "
                f"per layer backward ({_ms(rs)}), both exposed")
    if cluster.cp_comm == "a2a":  # DeepSpeed-Ulysses: heads for sequence, exposed
        from par3d.plan.cp_ep_comm import cp_all_to_all, ulysses_kv_heads

        fwd, bwd = cp_all_to_all(model, cluster, c)
        heads = model.heads // (c.tp * c.cp)
        kvh = ulysses_kv_heads(model, c.tp, c.cp) / c.cp
        return (f"  CP all-to-all (Ulysses, cp = {c.cp}, {where}): each rank attends over all {model.seq_len} "
                f"tokens with {heads} query head{'s' if heads != 1 else ''} and {kvh:g} K/V "
                f"head{'s' if kvh != 1 else ''}; Q/K/V in and the output out per layer forward ({_ms(fwd)}), "
                f"their gradients per layer backward ({_ms(bwd)}), exposed")
    hop = comm.p2p(kv, link).total
    core = choice_layer_times(model, cluster, c).core  # the attention core as the step prices it
    fwd, bwd = cp_exchange(model, c, link, core, cluster.dtype)
    return (f"  CP ring (cp = {c.cp}, {where}, "
            f"{link.beta / GB:g} GB/s): K/V block {kv / 1e6:.1f} MB, {c.cp - 1} hops x {_ms(hop)} = "
            f"{_ms((c.cp - 1) * hop)} per layer forward against {_ms(core * (c.cp - 1) / c.cp)} of remote-block "
            f"attention -> exposed {_ms(fwd)} forward, {_ms(bwd)} backward")


def _diff(best, other) -> str:
    keys = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "bubble", "dp_comm", "optimizer",
            "stragglers", "offload", "host")
    d = sorted(((other.breakdown.get(k, 0.0) - best.breakdown.get(k, 0.0), k) for k in keys), key=lambda t: -abs(t[0]))
    parts = [f"{k} {x:+.3f} s" for x, k in d[:3] if abs(x) > 1e-3 * max(best.step_time, 1e-9)]
    return (" (" + ", ".join(parts) + ")") if parts else ""
