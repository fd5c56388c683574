"""Shared pieces of the equivalence tests: one tiny GPT, layouts as config dicts, and a worker
that runs many layouts inside ONE spawned world (ranks outside a layout sit it out)."""

from __future__ import annotations

from typing import Any

TOL = 1e-5  # fp32: losses, gradients and parameters must agree to floating-point reordering


def case(dp: int = 1, pp: int = 1, tp: int = 1, schedule: str = "1f1b", m: int | None = None, v: int = 1,
         zero: int = 0, sp: bool = False, vocab: int = 256, layers: int = 8, steps: int = 3,
         recompute: str = "none", tied: bool = False, global_batch: int = 16, seq_len: int = 16,
         heads: int = 4, hidden: int = 32, dtype: str = "fp32", p2p: str = "auto", cp: int = 1,
         arch: str = "gpt", kv_heads: int | None = None) -> dict[str, Any]:
    m = m if m is not None else (1 if pp == 1 else 2 * pp)
    model: dict[str, Any] = {"vocab": vocab, "seq_len": seq_len, "layers": layers, "hidden": hidden,
                             "heads": heads, "tied_embeddings": tied}
    if arch != "gpt":
        model["arch"] = arch
    if kv_heads is not None:
        model["kv_heads"] = kv_heads
    return {
        "model": model,
        "parallel": {"dp": dp, "pp": pp, "tp": tp, "schedule": schedule, "microbatches": m,
                     "virtual_stages": v, "zero_stage": zero, "recompute": recompute, "sequence_parallel": sp,
                     "p2p": p2p, "cp": cp},
        "train": {"global_batch": global_batch, "micro_batch": global_batch // (m * dp), "steps": steps,
                  "lr": 2e-3, "min_lr": 2e-4, "warmup": 0, "seed": 0, "grad_clip": 1.0, "dtype": dtype,
                  "eps": 1e-6},  # Adam divides by sqrt(v): eps bounds how far it amplifies rounding,
        "progress": False,
    }


def reference_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The same model, data and seed on one process (one micro-batch)."""
    import copy

    ref = copy.deepcopy(cfg)
    ref["parallel"].pop("pipeline_layout", None)  # one process: no pipeline to cut
    ref["parallel"].update(dp=1, pp=1, tp=1, cp=1, schedule="1f1b", microbatches=1, virtual_stages=1, zero_stage=0,
                           sequence_parallel=False, recompute="none")
    ref["train"]["micro_batch"] = ref["train"]["global_batch"]
    return ref


def run_cases(cases: list[tuple[str, dict[str, Any]]], options: dict[str, Any]) -> dict[str, Any]:
    """Worker: run every case in this world; return what this rank holds of each."""
    import torch.distributed as dist

    from par3d.config import RunConfig
    from par3d.train import worker

    out: dict[str, Any] = {}
    for name, cfg in cases:
        RunConfig.from_dict(cfg).validate()
        # every rank starts each case together: a rank outside the last few layouts would otherwise
        # run ahead into the next case's new_group and wait there for the others, bounded by the
        # case's own --timeout (60 s) rather than the world's (a long stretch of 4-rank layouts
        # took longer than that once the pipeline got its per-direction groups)
        dist.barrier()
        r = worker(cfg, dict(options, quiet=True))
        if r.get("idle"):
            continue
        out[name] = {k: r.get(k) for k in ("rank", "history", "grads", "params", "comm_per_step", "logits",
                                            "peak_activation_bytes", "activation_bytes_per_microbatch",
                                            "peak_inflight_predicted", "coord", "p2p_transport",
                                            "memory", "bounds")}
    return out


def merged(results: list[dict[str, Any]], name: str, key: str) -> dict[str, Any]:
    m: dict[str, Any] = {}
    for r in results:
        if name in r and r[name].get(key):
            m.update(r[name][key])
    return m


def losses(results: list[dict[str, Any]], name: str) -> list[float]:
    r0 = next(r[name] for r in results if name in r and r[name]["rank"] == 0)
    return [h["loss"] for h in r0["history"]]


def max_diff(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, str]:
    assert set(a) == set(b), f"parameter names differ: {sorted(set(a) ^ set(b))}"
    worst, where = 0.0, ""
    for k in a:
        assert a[k].shape == b[k].shape, f"{k}: {tuple(a[k].shape)} vs {tuple(b[k].shape)}"
        d = float((a[k] - b[k]).abs().max())
        if d > worst:
            worst, where = d, k
    return worst, where


def assert_matches_reference(results: list[dict[str, Any]], name: str, ref: str, key: str) -> None:
    """Every tensor of `key` ("grads" or "params") of layout `name` equals the reference's."""
    diff, where = max_diff(merged(results, name, key), merged(results, ref, key))
    assert diff <= TOL, f"{name}: {key} of {where} differ by {diff} from the one-process run"
