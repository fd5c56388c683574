"""Configuration as dataclasses, validated once, before any process starts.

No torch import here: `par3d plan` and the CLI's validation must answer in milliseconds.

The three dataclasses mirror the three questions a run answers: what model (`ModelConfig`),
laid out how (`ParallelConfig`), trained how (`TrainConfig`).  `RunConfig` holds all three plus
the run-level switches (output paths, reports).  `validate()` collects *every* violated rule into
one `ConfigError` so a user fixes a config in one round trip.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v")
V_SCHEDULES = ("zb-v", "dualpipe-v")  # two chunks per rank in a V (pipeline/schedules.py)
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("fp32", "bf16")
ON_NONFINITE = ("skip", "stop")
P2P = ("auto", "shm", "backend")


class ConfigError(ValueError):
    """Every violated rule of a configuration, each with field, value, rule and a fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        msg = "invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(msg)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n > 0 else []


def _fmt_choices(xs: list[int]) -> str:
    xs = [str(x) for x in xs]
    if len(xs) <= 1:
        return "".join(xs)
    return ", ".join(xs[:-1]) + " or " + xs[-1]


ARCHS = ("gpt", "llama")
NORMS = ("layernorm", "rmsnorm")
# `par3d plan`'s spellings (--norm layer|rms, --position rotary) for the same choices
PLAN_NAMES = {("norm", "layer"): "layernorm", ("norm", "rms"): "rmsnorm", ("position", "rotary"): "rope"}
POSITIONS = ("learned", "rope")
ACTIVATIONS = ("gelu", "gelu_tanh", "silu")
# What `arch` means for the fields left unset (None).  gpt: GPT-2's block (Radford et al. 2019);
# llama: Touvron et al. 2023 (RMSNorm, rotary positions, SwiGLU, no biases); the epsilons are the
# defaults of the two families' Hugging Face configs (layer_norm_epsilon, rms_norm_eps).
ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt": {"norm": "layernorm", "norm_eps": 1e-5, "position": "learned", "gated_mlp": False,
            "activation": "gelu", "bias": True},
    "llama": {"norm": "rmsnorm", "norm_eps": 1e-6, "position": "rope", "gated_mlp": True,
              "activation": "silu", "bias": False},
}


@dataclass
class ModelConfig:
    """What model: shapes plus the architecture's switches.  `arch` fills every switch left None
    (ARCH_DEFAULTS); `fill_arch()` (called by RunConfig.resolve) writes them in.  Field names
    follow the planner's description (plan/models.py): kv_heads, ffn_hidden, tied_embeddings."""

    vocab: int = 256  # byte-level tokenizer
    seq_len: int = 64
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    ffn_hidden: int | None = None  # None -> 4 * hidden
    dropout: float = 0.0
    tied_embeddings: bool = False
    arch: str = "gpt"
    kv_heads: int | None = None  # None -> heads (multi-head attention); fewer: grouped-query attention
    norm: str | None = None  # layernorm | rmsnorm
    norm_eps: float | None = None
    position: str | None = None  # learned | rope
    rope_theta: float = 10000.0
    # rows of a learned position table (None -> seq_len); with rotary positions only recorded (the
    # max_position_embeddings a Hugging Face export declares)
    max_positions: int | None = None
    gated_mlp: bool | None = None  # SwiGLU-style act(x W_gate) * (x W_up)
    activation: str | None = None  # gelu (exact) | gelu_tanh (GPT-2's gelu_new) | silu
    bias: bool | None = None  # biases in the linear layers

    @property
    def ffn(self) -> int:
        return self.ffn_hidden if self.ffn_hidden is not None else 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def positions(self) -> int:
        return self.max_positions if self.max_positions is not None else self.seq_len

    def fill_arch(self) -> ModelConfig:
        """Write the architecture's defaults into the switches left None (idempotent); `par3d plan`'s names of the
        norms and positions (--norm layer|rms, --position rotary) read as these."""
        self.norm = PLAN_NAMES.get(("norm", self.norm), self.norm)
        self.position = PLAN_NAMES.get(("position", self.position), self.position)
        for k, v in ARCH_DEFAULTS.get(self.arch, ARCH_DEFAULTS["gpt"]).items():
            if getattr(self, k) is None:
                setattr(self, k, v)
        return self


@dataclass
class ParallelConfig:
    dp: int = 1
    pp: int = 1
    tp: int = 1
    schedule: str = "1f1b"
    microbatches: int | None = None  # m; derived from global_batch when None
    virtual_stages: int = 1  # v: >= 2 for interleaved; 2 (set by resolve) for zb-v / dualpipe-v
    schedule_csv: str | None = None  # a compute-only schedule in torch's CSV notation; sets m and v
    zero_stage: int = 0  # 0 plain DP; ZeRO 1 optimizer state, 2 + gradients, 3 + parameters sharded
    cp: int = 1  # context parallelism: the sequence split over cp ranks (ring attention)
    recompute: str = "none"
    sequence_parallel: bool = False
    # pipeline transfers: "auto" = shared memory between CPU ranks on one host, the backend's
    # send/recv otherwise; "shm" insists on shared memory; "backend" always uses gloo/nccl
    p2p: str = "auto"
    # the layers of each pipeline chunk in model order, pp x virtual_stages of them (the first chunk also holds
    # the embedding, the last the head; those two may hold no layer), as Megatron-Core's
    # pipeline_model_parallel_layout cuts a model; None: the balanced partition (pipeline/partition.py)
    pipeline_layout: list[int] | None = None
    # zb-v only: the chunk times (F, BI, BW) its list scheduler orders the actions for (`schedules.zero_bubble_v`),
    # optionally a fourth number, the share of a chunk's activations BI keeps for BW, which its memory cap counts;
    # None: equal times.  par3d plan --emit-config writes the times its plan was priced with (cost.zbv_times)
    zbv_times: list[float] | None = None

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp


@dataclass
class TrainConfig:
    global_batch: int = 16  # sequences per optimizer step, over all DP ranks
    micro_batch: int | None = None  # sequences per micro-batch per DP rank; derived when None
    steps: int = 40
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 5
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # 0 disables clipping
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    seed: int = 0
    dtype: str = "fp32"
    data: str | None = None  # text file or folder; None -> the Python standard library's source
    out: str = "runs/latest"
    on_nonfinite: str = "skip"
    tokenizer: str | None = None  # a Hugging Face tokenizer.json; None -> bytes (data.py)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # run-level switches (not part of the math of training)
    metrics_out: str | None = None
    trace_out: str | None = None
    comm_report: bool = False
    synthetic_stage_ms: tuple[float, float] | None = None
    nproc: int | None = None
    timeout_s: float = 60.0
    threads_per_rank: int = 1
    save_every: int = 0
    keep_last: int = 2
    resume: str | None = None
    progress: bool = True
    json: bool = False
    hardware: str | None = None  # calibrated hardware file for the end-of-run prediction
    init_from: str | None = None  # a Hugging Face model folder (safetensors) to start from

    # ---- derived quantities -------------------------------------------------------------
    def resolve(self) -> RunConfig:
        """Fill micro_batch / microbatches from global_batch = micro_batch * m * dp."""
        p, t = self.parallel, self.train
        self.model.fill_arch()

        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        if p.schedule in V_SCHEDULES and p.virtual_stages == 1:
            p.virtual_stages = 2  # the V: stages r and 2p-1-r on rank r
        if p.schedule_csv and isinstance(p.schedule_csv, str):
            self._resolve_csv()
        # derive only from well-typed values; validate() reports the others
        if not all(is_int(v) for v in (p.dp, p.pp, p.virtual_stages, t.global_batch)) or \
                not all(v is None or is_int(v) for v in (p.microbatches, t.micro_batch)):
            return self
        dp = max(p.dp, 1)
        if p.microbatches is None and t.micro_batch is None:
            m = 2 * p.pp * p.virtual_stages if p.pp > 1 else 1
            # shrink m until it divides the per-DP-rank batch (keeps `--dp 2` working)
            per_rank = t.global_batch // dp if t.global_batch % dp == 0 else 0
            while m > 1 and per_rank % m != 0:
                m -= 1
            p.microbatches = max(m, 1)
            t.micro_batch = max(per_rank // p.microbatches, 1) if per_rank else 1
        elif p.microbatches is None:
            denom = t.micro_batch * dp
            p.microbatches = t.global_batch // denom if denom and t.global_batch % denom == 0 else 1
        elif t.micro_batch is None:
            denom = p.microbatches * dp
            t.micro_batch = t.global_batch // denom if denom and t.global_batch % denom == 0 else 1
        return self

    def _resolve_csv(self) -> None:
        """A schedule CSV fixes m and v (and stands in for parallel.schedule); errors in it are
        kept for validate()."""
        from par3d.pipeline.schedules import ScheduleError, from_csv

        p = self.parallel
        self._csv_error: str | None = None
        try:
            with open(p.schedule_csv, newline="") as fh:  # type: ignore[arg-type]
                loaded = from_csv(fh.read())
        except OSError as e:
            self._csv_error = f"parallel.schedule_csv={p.schedule_csv!r}: cannot read it: {e}"
            return
        except ScheduleError as e:
            self._csv_error = f"parallel.schedule_csv={p.schedule_csv!r} is not a valid schedule: {e}"
            return
        if loaded.p != p.pp:
            self._csv_error = (f"parallel.schedule_csv={p.schedule_csv!r} has {loaded.p} rows (pipeline ranks) but "
                               f"pp={p.pp}; use --pp {loaded.p}")
            return
        try:
            loaded.check()
        except ScheduleError as e:
            self._csv_error = f"parallel.schedule_csv={p.schedule_csv!r} is not a valid schedule: {e}"
            return
        p.microbatches, p.virtual_stages = loaded.m, loaded.v

    def validate(self) -> RunConfig:
        """Raise one ConfigError listing every violated rule; return self when valid."""
        self.resolve()
        m, p, t = self.model, self.parallel, self.train
        # problems found while reading a TOML file (unknown sections or fields) come first, so one
        # round trip reports them together with the type and range errors below
        errs: list[str] = list(getattr(self, "_load_problems", []))

        def pos(obj: str, name: str, value: Any, minimum: int = 1) -> bool:
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                errs.append(f"{obj}.{name}={value!r} must be an integer >= {minimum}; "
                            f"set --{name.replace('_', '-')} to a value >= {minimum}")
                return False
            return True

        ok_model = all([pos("model", "vocab", m.vocab, 2), pos("model", "seq_len", m.seq_len),
                        pos("model", "layers", m.layers), pos("model", "hidden", m.hidden),
                        pos("model", "heads", m.heads)])
        if m.ffn_hidden is not None:
            ok_model &= pos("model", "ffn_hidden", m.ffn_hidden)
        if not (isinstance(m.dropout, (int, float)) and 0.0 <= m.dropout < 1.0):
            errs.append(f"model.dropout={m.dropout!r} must be in [0, 1); use --dropout 0")
        ok_par = all([pos("parallel", "dp", p.dp), pos("parallel", "pp", p.pp), pos("parallel", "tp", p.tp),
                      pos("parallel", "cp", p.cp), pos("parallel", "virtual_stages", p.virtual_stages)])
        if ok_model and m.hidden % m.heads != 0:
            errs.append(f"model.hidden={m.hidden} is not divisible by heads={m.heads}; "
                        f"heads may be {_fmt_choices(divisors(m.hidden)[:12])}")
        if ok_model:
            ok_model &= _check_arch(m, errs)
        if ok_model and ok_par:
            if m.kv_heads is not None and m.kv < p.tp and p.tp % m.kv:
                errs.append(f"parallel.tp={p.tp}: kv_heads={m.kv} neither is divisible by tp nor divides it "
                            f"(K/V heads are split over TP ranks, or replicated when tp > kv_heads); "
                            f"tp may be {_fmt_choices([d for d in divisors(m.heads) if d % m.kv == 0 or m.kv % d == 0])}")
            elif m.kv_heads is not None and m.kv >= p.tp and m.kv % p.tp:
                errs.append(f"parallel.tp={p.tp}: kv_heads={m.kv} is not divisible by tp={p.tp}; "
                            f"tp may be {_fmt_choices(divisors(m.kv))} or a multiple of {m.kv} dividing heads")
            if m.heads % p.tp != 0:
                errs.append(f"parallel.tp={p.tp}: heads={m.heads} is not divisible by tp={p.tp} "
                            f"(each TP rank must own whole attention heads); "
                            f"tp may be {_fmt_choices(divisors(m.heads))}")
            if m.ffn % p.tp != 0:
                errs.append(f"parallel.tp={p.tp}: ffn_hidden={m.ffn} is not divisible by tp={p.tp}; "
                            f"choose tp from {_fmt_choices(divisors(m.ffn)[:12])} or change --ffn-hidden")
            if p.cp > 1 and m.seq_len % (2 * p.cp) != 0:
                errs.append(f"parallel.cp={p.cp}: seq_len={m.seq_len} is not divisible by 2 x cp = {2 * p.cp} "
                            f"(each CP rank holds two mirrored chunks of the sequence); use a --seq-len that "
                            f"is a multiple of {2 * p.cp} or a smaller --cp")
            elif p.sequence_parallel and (m.seq_len // p.cp) % p.tp != 0:
                errs.append(f"parallel.sequence_parallel: seq_len={m.seq_len} / cp={p.cp} is not divisible by "
                            f"tp={p.tp}; use a seq_len that is a multiple of {p.cp * p.tp} or drop "
                            f"--sequence-parallel")
            if p.cp > 1 and isinstance(m.dropout, (int, float)) and m.dropout > 0:
                errs.append(f"parallel.cp={p.cp} with model.dropout={m.dropout}: ring attention has no "
                            f"attention dropout; use --dropout 0 or --cp 1")
            n_chunks = p.pp * p.virtual_stages
            if p.zbv_times is not None:
                zt = p.zbv_times
                if not (isinstance(zt, list) and len(zt) in (3, 4, 5)
                        and all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf")
                                for x in zt)
                        and (len(zt) == 3 or zt[3] <= 1)):
                    errs.append(f"parallel.zbv_times={zt!r} must be three times > 0, F, BI and BW of one chunk, "
                                f"optionally the share in (0, 1] of a chunk's activations BI keeps for BW, and then "
                                f"what the head's chunk keeps (> 0, in chunks' forwards), e.g. [1, 2, 1], "
                                f"[1, 1.1, 0.9, 0.43] or [1, 1.1, 0.9, 0.43, 1.6]")
                elif p.schedule != "zb-v" or p.schedule_csv:
                    errs.append(f"parallel.zbv_times={zt!r} orders zb-v's actions, but the schedule is "
                                f"{'the file ' + repr(p.schedule_csv) if p.schedule_csv else repr(p.schedule)}; "
                                f"drop --zbv-times or use --schedule zb-v")
            if p.pipeline_layout is not None:
                errs += _layout_errors(p.pipeline_layout, n_chunks, m.layers, p.pp, p.virtual_stages)
            if m.layers + 2 < n_chunks:  # the embedding and the head may each fill a chunk (partition.py)
                errs.append(f"parallel.pp={p.pp} x virtual_stages={p.virtual_stages} = {n_chunks} pipeline "
                            f"chunks but model.layers={m.layers}; every chunk needs at least one layer (or the "
                            f"embedding or the head alone, so at most layers + 2 chunks): use --layers >= "
                            f"{n_chunks - 2} or a smaller --pp/--virtual-stages")
        if p.schedule_csv:
            if getattr(self, "_csv_error", None):
                errs.append(self._csv_error)  # type: ignore[arg-type]
        elif p.schedule not in SCHEDULES:
            errs.append(f"parallel.schedule={p.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
        elif ok_par:
            if p.schedule == "interleaved":
                if p.virtual_stages < 2:
                    errs.append("parallel.schedule='interleaved' needs virtual_stages >= 2; "
                                "add --virtual-stages 2")
                if p.pp < 2:
                    errs.append("parallel.schedule='interleaved' needs pp >= 2; add --pp 2")
                if p.microbatches is not None and p.microbatches % p.pp != 0:
                    errs.append(f"parallel.microbatches={p.microbatches}: the interleaved schedule needs "
                                f"m to be a multiple of pp={p.pp}; use --microbatches "
                                f"{max(p.pp, (p.microbatches // p.pp) * p.pp)}")
            elif p.schedule in V_SCHEDULES:
                if p.virtual_stages != 2:
                    errs.append(f"parallel.schedule={p.schedule!r} holds two chunks per rank in a V; "
                                f"virtual_stages={p.virtual_stages} must be 2: use --virtual-stages 2")
                if p.schedule == "dualpipe-v" and p.microbatches is not None and p.microbatches < 2 * p.pp:
                    errs.append(f"parallel.microbatches={p.microbatches}: dualpipe-v needs m >= 2 x pp = "
                                f"{2 * p.pp}; use --microbatches {2 * p.pp}")
            elif p.virtual_stages != 1:
                errs.append(f"parallel.virtual_stages={p.virtual_stages} only applies to the interleaved "
                            f"schedule (schedule={p.schedule!r}); use --schedule interleaved or "
                            f"--virtual-stages 1")
        if p.zero_stage not in (0, 1, 2, 3):
            errs.append(f"parallel.zero_stage={p.zero_stage!r} is unknown; use 0 (plain DP), 1 (optimizer "
                        f"state sharded), 2 (+ gradients) or 3 (+ parameters)")
        if p.recompute not in RECOMPUTE:
            errs.append(f"parallel.recompute={p.recompute!r} is unknown; choose one of {', '.join(RECOMPUTE)}")
        if p.p2p not in P2P:
            errs.append(f"parallel.p2p={p.p2p!r} is unknown; choose one of {', '.join(P2P)}")
        if ok_par and p.microbatches is not None:
            pos("parallel", "microbatches", p.microbatches)
        pos("train", "global_batch", t.global_batch)
        if t.micro_batch is not None:
            pos("train", "micro_batch", t.micro_batch)
        if isinstance(t.steps, int) and not isinstance(t.steps, bool) and t.steps == 0:
            errs.append("train.steps=0 would start every process and train nothing; set --steps to the "
                        "number of optimizer steps to run (>= 1)")
        else:
            pos("train", "steps", t.steps, 1)
        batch_split_ok = True
        if ok_par and isinstance(t.global_batch, int) and t.global_batch > 0 and t.global_batch % p.dp:
            batch_split_ok = False
            up = -(-t.global_batch // p.dp) * p.dp
            errs.append(f"train.global_batch={t.global_batch} is not divisible by dp={p.dp} (each DP rank "
                        f"takes an equal slice); use --global-batch {up}")
        if (ok_par and batch_split_ok and isinstance(t.global_batch, int) and isinstance(t.micro_batch, int)
                and isinstance(p.microbatches, int) and t.micro_batch > 0 and p.microbatches > 0):
            if t.micro_batch * p.microbatches * p.dp != t.global_batch:
                errs.append(f"train.global_batch={t.global_batch} != micro_batch={t.micro_batch} x "
                            f"microbatches={p.microbatches} x dp={p.dp} = "
                            f"{t.micro_batch * p.microbatches * p.dp}; give a global batch that is a "
                            f"multiple of dp={p.dp} and leave --micro-batch/--microbatches to be derived")
        for name in ("lr", "eps"):
            v = getattr(t, name)
            if not (isinstance(v, (int, float)) and v > 0):
                errs.append(f"train.{name}={v!r} must be a positive number")
        if not (isinstance(t.min_lr, (int, float)) and t.min_lr >= 0):
            errs.append(f"train.min_lr={t.min_lr!r} must be >= 0")
        if not (isinstance(t.warmup, int) and t.warmup >= 0):
            errs.append(f"train.warmup={t.warmup!r} must be an integer >= 0")
        if not (isinstance(t.weight_decay, (int, float)) and t.weight_decay >= 0):
            errs.append(f"train.weight_decay={t.weight_decay!r} must be >= 0")
        if not (isinstance(t.grad_clip, (int, float)) and t.grad_clip >= 0):
            errs.append(f"train.grad_clip={t.grad_clip!r} must be >= 0 (0 disables clipping)")
        for name in ("beta1", "beta2"):
            v = getattr(t, name)
            if not (isinstance(v, (int, float)) and 0 <= v < 1):
                errs.append(f"train.{name}={v!r} must be in [0, 1)")
        if t.dtype not in DTYPES:
            errs.append(f"train.dtype={t.dtype!r} is unknown; choose fp32 or bf16")
        if t.on_nonfinite not in ON_NONFINITE:
            errs.append(f"train.on_nonfinite={t.on_nonfinite!r} is unknown; choose skip or stop")
        if t.data is not None:
            data_errs = _check_data_path(t.data)
            errs.extend(data_errs)
            if not data_errs and isinstance(m.seq_len, int) and _data_bytes(t.data, m.seq_len + 1) < m.seq_len + 1:
                errs.append(f"train.data={t.data!r} holds fewer than seq_len+1={m.seq_len + 1} bytes; "
                            f"give more text or a smaller --seq-len")
        if self.nproc is not None and ok_par and self.nproc != p.world_size:
            errs.append(f"nproc={self.nproc} != dp x pp x cp x tp = {p.world_size}; drop --nproc or make them "
                        f"equal")
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            errs.append(f"timeout_s={self.timeout_s!r} must be > 0 seconds")
        if self.synthetic_stage_ms is not None:
            sm = self.synthetic_stage_ms
            if len(sm) != 2 or any((not isinstance(x, (int, float))) or x < 0 for x in sm):
                errs.append(f"synthetic_stage_ms={sm!r} must be two non-negative numbers F,B (ms)")
        if not (isinstance(self.save_every, int) and self.save_every >= 0):
            errs.append(f"save_every={self.save_every!r} must be an integer >= 0")
        if not (isinstance(self.keep_last, int) and self.keep_last >= 1):
            errs.append(f"keep_last={self.keep_last!r} must be an integer >= 1")
        if errs:
            raise ConfigError(errs)
        return self

    # ---- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any], strict: bool = True) -> RunConfig:
        """The configuration `d` describes.  Unknown sections and fields raise ConfigError; with
        `strict=False` they are kept on the result and reported by `validate()` with every other
        problem (a TOML file with a bad section and a badly typed value reports both at once)."""
        errs: list[str] = []
        sections = {"model": ModelConfig, "parallel": ParallelConfig, "train": TrainConfig}
        kwargs: dict[str, Any] = {}
        run_fields = {f.name for f in dataclasses.fields(RunConfig)} - set(sections)
        for key, value in d.items():
            if key in sections:
                cls = sections[key]
                names = {f.name for f in dataclasses.fields(cls)}
                if not isinstance(value, dict):
                    errs.append(f"[{key}] must be a table; write it as a [{key}] section")
                    continue
                bad = sorted(set(value) - names)
                for b in bad:
                    errs.append(f"{key}.{b} is not a known field; known: {', '.join(sorted(names))}")
                kwargs[key] = cls(**{k: v for k, v in value.items() if k in names})
            elif key in run_fields:
                kwargs[key] = tuple(value) if key == "synthetic_stage_ms" and value is not None else value
            else:
                errs.append(f"{key} is not a known section or field; sections: model, parallel, train")
        if errs and strict:
            raise ConfigError(errs)
        cfg = RunConfig(**kwargs)
        cfg._load_problems = errs  # type: ignore[attr-defined]  # not a field: never serialised
        return cfg

    @staticmethod
    def load_toml(path: str) -> RunConfig:
        if not os.path.isfile(path):
            raise ConfigError([f"config={path!r} does not exist; give the path of a TOML file"])
        try:
            with open(path, "rb") as fh:
                d = tomllib.load(fh)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError([f"config={path!r} is not valid TOML: {e}"]) from e
        return RunConfig.from_dict(d, strict=False)

    def to_toml(self) -> str:
        return dict_to_toml(self.to_dict())


def dict_to_toml(d: dict[str, Any]) -> str:
    """A tiny TOML writer for our flat sections (tomllib only reads)."""

    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(val(x) for x in v) + "]"
        raise TypeError(type(v))

    top = [f"{k} = {val(v)}" for k, v in d.items() if not isinstance(v, dict) and v is not None]
    out = top + [""] if top else []
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(f"[{k}]")
            out += [f"{kk} = {val(vv)}" for kk, vv in v.items() if vv is not None]
            out.append("")
    return "\n".join(out)


# rope_theta of the catalogue's Llama families (their config.json files: Llama 2 10000, Llama 3 500000)
_ROPE_THETA = {"llama2": 10000.0, "llama3": 500000.0, "llama3.1": 500000.0}


def model_config_from_spec(spec: Any) -> ModelConfig:
    """The runtime's ModelConfig of a planner ModelSpec (plan/models.py): the same model, or a ConfigError naming what
    the runtime lacks to build it (routed experts, latent attention, another head width, local attention, a Q/K norm,
    ALiBi, squared ReLU)."""
    from par3d.plan.models import RUNTIME_LACKS

    lacks = ("routed experts (a mixture of experts)" if spec.moe else "multi-head latent attention" if spec.mla
             else f"heads of {spec.head_dim} channels (hidden / heads = {spec.hidden // spec.heads})"
             if spec.head_dim * spec.heads != spec.hidden
             else "local attention (chunks or a sliding window)" if spec.local_attention
             else "norm on Q and K (qk-norm)" if spec.qk_norm
             else RUNTIME_LACKS.get(spec.name.lower()))
    if lacks:
        raise ConfigError([f"model {spec.name!r}: par3d train has no {lacks}, so it cannot build this model; plan it "
                           "with par3d plan, or train a model the runtime builds (a GPT or Llama block)"])
    llama = spec.gated and not spec.learned_pos
    return ModelConfig(
        arch="llama" if llama else "gpt", vocab=spec.vocab, seq_len=spec.seq_len, layers=spec.layers,
        hidden=spec.hidden, heads=spec.heads, ffn_hidden=spec.ffn,
        kv_heads=spec.kv_heads if spec.kv != spec.heads else None, tied_embeddings=spec.tied,
        norm="rmsnorm" if spec.norm == "rms" else "layernorm", position="learned" if spec.learned_pos else "rope",
        gated_mlp=spec.gated, activation="silu" if spec.gated else "gelu", bias=spec.bias,
        rope_theta=_ROPE_THETA.get(spec.name.lower().split("-")[0], 10000.0)).fill_arch()


def _layout_errors(layout: Any, n_chunks: int, layers: int, pp: int, v: int) -> list[str]:
    """What is wrong with parallel.pipeline_layout (each rule named with a fix), or nothing."""
    shown = layout if not isinstance(layout, (list, tuple)) else ",".join(map(str, layout))
    if not isinstance(layout, (list, tuple)) or not layout or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in layout):
        return [f"parallel.pipeline_layout={shown!r} must be a list of layer counts >= 0, one per pipeline chunk; "
                f"e.g. --pipeline-layout 2,2 for 4 layers on pp 2"]
    if len(layout) != n_chunks:
        return [f"parallel.pipeline_layout={shown} has {len(layout)} chunks but pp={pp} x virtual_stages={v} = "
                f"{n_chunks}; give {n_chunks} layer counts"]
    if sum(layout) != layers:
        return [f"parallel.pipeline_layout={shown} sums to {sum(layout)} layers but model.layers={layers}; give "
                f"counts that sum to {layers}"]
    empty = [i for i, n in enumerate(layout) if n == 0 and 0 < i < n_chunks - 1]
    if empty or (n_chunks == 1 and layout[0] == 0):
        return [f"parallel.pipeline_layout={shown}: chunk {empty[0] if empty else 0} holds no layer; only the first "
                f"chunk (the embedding alone) and the last (the head alone) may be empty"]
    return []


def smoke_model(mc: ModelConfig, tp: int, chunks: int) -> ModelConfig:
    """The same architecture at CPU size, valid under the same TP degree and pipeline chunks: one
    layer per chunk, 16 channels per head, the GQA ratio kept (capped at 4), vocabulary 256, 64
    tokens per sequence — for a smoke test of a planned layout (`par3d plan --emit-smoke`)."""
    kv = mc.kv
    group = min(mc.heads // kv, 4)
    if kv >= tp:
        kv_s, heads_s = tp, tp * group
    else:  # tp > kv: the planner only proposes tp a multiple of kv (replicated K/V heads)
        kv_s, heads_s = kv, tp
    hidden = 16 * heads_s
    return dataclasses.replace(
        mc, vocab=256, seq_len=64, layers=chunks, hidden=hidden, heads=heads_s,
        kv_heads=kv_s if kv_s != heads_s else None, ffn_hidden=(3 if mc.gated_mlp else 4) * hidden,
        max_positions=None)


def model_config_from_hf_folder(path: str, seq_len: int | None = None) -> ModelConfig:
    """`--init-from PATH`: the model a Hugging Face checkpoint folder's config.json describes."""
    if not os.path.isdir(path):
        raise ConfigError([f"--init-from {path!r}: no such folder; give a folder written by "
                           f"save_pretrained (config.json + model.safetensors)"])
    from par3d import hf  # the config half of the HF edge imports nothing optional

    return hf.model_config_from_hf(hf.read_hf_config(path), seq_len, path)


def model_config_from_name(name: str, seq_len: int | None = None) -> ModelConfig:
    """`--model NAME|PATH`: a planner catalogue name (plan/models.py) or a Hugging Face config.json
    (a file, or a folder holding one) as the runtime's ModelConfig.  Raises ConfigError."""
    from par3d.plan.models import CATALOGUE, model_names

    spec = CATALOGUE.get(name.lower())
    if spec is not None:
        mc = model_config_from_spec(spec)
        mc.seq_len = seq_len or mc.seq_len
        return mc
    if os.path.exists(name):
        from par3d import hf  # the config half of the HF edge imports nothing optional

        return hf.model_config_from_hf(hf.read_hf_config(name), seq_len, name)
    raise ConfigError([f"--model {name!r} is neither a catalogue name nor a file; choose one of "
                       f"{', '.join(model_names())} or give a Hugging Face config.json (or its folder)"])


def _check_arch(m: ModelConfig, errs: list[str]) -> bool:
    """The architecture switches (after fill_arch); appends problems, returns False on any."""
    n = len(errs)
    if m.arch not in ARCHS:
        errs.append(f"model.arch={m.arch!r} is unknown; choose one of {', '.join(ARCHS)} (--arch)")
    for name, choices in (("norm", NORMS), ("position", POSITIONS), ("activation", ACTIVATIONS)):
        v = getattr(m, name)
        if v is not None and v not in choices:
            errs.append(f"model.{name}={v!r} is unknown; choose one of {', '.join(choices)}")
    if m.kv_heads is not None:
        if not isinstance(m.kv_heads, int) or isinstance(m.kv_heads, bool) or m.kv_heads < 1:
            errs.append(f"model.kv_heads={m.kv_heads!r} must be an integer >= 1; set --kv-heads")
        elif m.heads % m.kv_heads:
            errs.append(f"model.kv_heads={m.kv_heads} must divide heads={m.heads} (each K/V head serves "
                        f"heads/kv_heads query heads); kv_heads may be {_fmt_choices(divisors(m.heads))}")
    if m.norm_eps is not None and not (isinstance(m.norm_eps, (int, float)) and m.norm_eps > 0):
        errs.append(f"model.norm_eps={m.norm_eps!r} must be a positive number")
    if not (isinstance(m.rope_theta, (int, float)) and m.rope_theta > 0):
        errs.append(f"model.rope_theta={m.rope_theta!r} must be a positive number")
    if m.position == "rope" and m.head_dim % 2:
        errs.append(f"model.position='rope' needs an even head dimension, hidden/heads = {m.head_dim}; "
                    f"change --hidden or --heads")
    if m.max_positions is not None and m.position == "learned" and m.max_positions < m.seq_len:
        errs.append(f"model.max_positions={m.max_positions} < seq_len={m.seq_len}: the learned position "
                    f"table has no row for the later positions; use --seq-len <= {m.max_positions}")
    return len(errs) == n


def _check_data_path(path: str) -> list[str]:
    from par3d.textcheck import binary_reason, text_files

    if not os.path.exists(path):
        return [f"train.data={path!r} does not exist; give a text file or a folder of text files, "
                f"or omit --data to use the built-in corpus"]
    if os.path.isfile(path):
        if os.path.getsize(path) == 0:
            return [f"train.data={path!r} is empty; give a file with text in it"]
        try:
            why = binary_reason(path)
        except OSError as e:
            return [f"train.data={path!r} cannot be read ({e.strerror}); give a readable text file"]
        if why:
            return [f"train.data={path!r} is not text: it {why}; give a text file (the byte tokenizer "
                    f"trains on text)"]
        return []
    text, binary = text_files(path)
    if text:
        return []
    if binary:
        return [f"train.data={path!r} holds only binary files ({len(binary)}, e.g. {binary[0]!r}); "
                f"put text files in it"]
    return [f"train.data={path!r} is a folder with no non-empty files; put text files in it"]


def _data_bytes(path: str, enough: int) -> int:
    """Bytes of text under `path` (a folder's binary files are skipped, as `data.Corpus` does)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    from par3d.textcheck import text_files

    total = 0
    for f in text_files(path)[0]:
        total += os.path.getsize(f)
        if total >= enough:
            return total
    return total
