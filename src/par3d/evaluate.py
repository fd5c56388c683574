"""`par3d eval`: the mean token cross-entropy of a model on the first batches of a text, under any
DP x PP x TP layout.

    eval_worker(cfg)              every rank:
        chunks = GPTStage(...)    the same units and partition as training
        weights                   --init-from (Hugging Face folder) or --resume (par3d checkpoint)
        for each batch:           data.eval_batch: consecutive, non-overlapping windows of the text
            this DP rank's slice, forward through the pipeline stage by stage (no backward)
        loss = sum over DP and PP of the per-token losses / tokens

The batches are a pure function of (text, batch index), so every layout scores the same tokens
and the loss agrees across layouts to floating-point reordering.
"""

from __future__ import annotations

import os
from typing import Any

from par3d.config import RunConfig


def forward_loss_sum(chunks: list[Any], groups: Any, p: int, v: int, x: Any, y: Any, act_shape: tuple[int, ...],
                     dtype: Any, device: Any) -> Any:
    """Sum of the per-token losses of one batch, walking the p·v pipeline stages in order (stage s
    lives on pipeline rank s mod p as chunk s div p, as in training).  Returns a float64 scalar
    tensor: the sum on the last stage's rank, zero elsewhere."""
    import torch

    from par3d import comm

    n = p * v
    total = torch.zeros(1, dtype=torch.float64, device=device)
    h = None
    for s in range(n):
        if s % p != groups.coord.pp:
            continue
        chunk = chunks[s // p]
        if s > 0 and p > 1:
            h = torch.empty(act_shape, dtype=dtype, device=device)
            comm.irecv(h, groups.pp.ranks[(s - 1) % p], groups.pp).wait()
        if s == n - 1:
            total += chunk(h if s > 0 else x, y).double().sum()
        else:
            h = chunk(x if s == 0 else h)
            if p > 1:
                comm.isend(h.contiguous(), groups.pp.ranks[(s + 1) % p], groups.pp).wait()
    return total


def eval_worker(cfg_dict: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch
    import torch.distributed as dist

    from par3d import checkpoint, comm
    from par3d.data import Corpus, eval_batch
    from par3d.mesh import Mesh, build_groups
    from par3d.model import GPTStage, ModelContext
    from par3d.pipeline.partition import gpt_partition

    cfg = RunConfig.from_dict(cfg_dict).resolve()
    mc, pc, tc = cfg.model, cfg.parallel, cfg.train
    rank = dist.get_rank() if dist.is_initialized() else 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    dtype = torch.bfloat16 if tc.dtype == "bf16" else torch.float32
    groups = build_groups(Mesh(pc.dp, pc.pp, pc.tp), rank, timeout_s=cfg.timeout_s)
    if groups is None:
        return {"rank": rank, "idle": True}
    c, p, v = groups.coord, pc.pp, pc.virtual_stages
    part = gpt_partition(mc.layers, p * v, mc.hidden, mc.seq_len, mc.vocab, mc.ffn_hidden,
                         split=pc.pipeline_layout)
    sp = pc.sequence_parallel and pc.tp > 1
    ctx = ModelContext(tp=groups.tp, seed=tc.seed, sequence_parallel=sp, dtype=dtype)
    chunks = [GPTStage(mc, ctx, *part.bounds[k * p + c.pp]) for k in range(v)]
    if cfg.init_from:
        from par3d import hf

        hf.load_into(cfg.init_from, chunks, groups.tp, mc)
    elif options.get("resume_dir"):
        checkpoint.load_weights(options["resume_dir"], chunks, groups, cfg)
    chunks = [ch.to(device).eval() for ch in chunks]

    corpus = Corpus.load(tc.data, tc.tokenizer)
    n_batches, batch = int(options["eval_batches"]), tc.global_batch
    per = batch // pc.dp
    act_shape = (per, mc.seq_len // pc.tp if sp else mc.seq_len, mc.hidden)
    total = torch.zeros(1, dtype=torch.float64, device=device)
    comm.COUNTER.enabled = False
    with torch.no_grad():
        for i in range(n_batches):
            x, y = eval_batch(corpus, i, batch, mc.seq_len)
            x, y = (torch.from_numpy(np.ascontiguousarray(t[c.dp * per:(c.dp + 1) * per])).to(device)
                    for t in (x, y))
            total += forward_loss_sum(chunks, groups, p, v, x, y, act_shape, dtype, device)
    comm.all_reduce(total, groups.pp)
    comm.all_reduce(total, groups.dp)
    tokens = n_batches * batch * mc.seq_len
    return {"rank": rank, "loss": float(total) / tokens, "tokens": tokens}


def run_eval(cfg: RunConfig, eval_batches: int, resume_dir: str | None = None) -> dict[str, Any]:
    """Start the world (or join torchrun's) and return {"loss", "tokens"}; rank 0's answer."""
    from par3d.distributed import run_main

    res = run_main(eval_worker, cfg.parallel.world_size,
                   (cfg.to_dict(), {"eval_batches": eval_batches, "resume_dir": resume_dir}),
                   timeout_s=cfg.timeout_s, threads=cfg.threads_per_rank)
    results = res if isinstance(res, list) else [res]
    r0 = next(r for r in results if r.get("rank") == 0) if len(results) > 1 else results[0]
    return {"loss": r0["loss"], "tokens": r0["tokens"]}
