"""Byte-level tokenizer, a corpus that exists on every machine, and layout-free sampling.

The default corpus is the source text of the Python standard library that runs par3d (the
`.py` files next to `os.py`, in sorted order, up to `DEFAULT_CORPUS_BYTES`): no download, and
real text with structure a small GPT can learn.

Sampling is a pure function of (seed, step): step k's global batch is the same list of
sequences whatever the layout.  A DP rank takes a contiguous slice of it and cuts that slice
into micro-batches, so the set of sequences a step trains on never depends on dp, pp or tp.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

DEFAULT_CORPUS_BYTES = 2_000_000
VOCAB = 256  # bytes


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8", errors="replace"), dtype=np.uint8)


def decode(tokens: np.ndarray | list[int]) -> str:
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def _stdlib_files() -> list[str]:
    root = os.path.dirname(os.__file__)
    return sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".py"))


def _read_paths(paths: list[str], limit: int | None) -> bytes:
    chunks: list[bytes] = []
    total = 0
    for p in paths:
        try:
            with open(p, "rb") as fh:
                b = fh.read()
        except OSError:
            continue
        chunks.append(b)
        total += len(b)
        if limit is not None and total >= limit:
            break
    data = b"".join(chunks)
    return data[:limit] if limit is not None else data


@dataclass
class Corpus:
    tokens: np.ndarray  # uint8
    source: str

    @staticmethod
    def load(path: str | None = None, limit: int | None = None) -> Corpus:
        if path is None:
            return Corpus(np.frombuffer(_read_paths(_stdlib_files(), limit or DEFAULT_CORPUS_BYTES),
                                        dtype=np.uint8), "python-stdlib")
        if os.path.isdir(path):
            files = sorted(os.path.join(r, f) for r, _d, fs in os.walk(path) for f in fs)
            data = _read_paths(files, limit)
        else:
            data = _read_paths([path], limit)
        if not data:
            raise ValueError(f"data={path!r} holds no text; give a non-empty text file or folder")
        return Corpus(np.frombuffer(data, dtype=np.uint8), path)

    def __len__(self) -> int:
        return len(self.tokens)


def batch_offsets(seed: int, step: int, global_batch: int, n_tokens: int, seq_len: int) -> np.ndarray:
    """Start offsets of the `global_batch` sequences of step `step` — a pure function."""
    if n_tokens < seq_len + 1:
        raise ValueError(f"corpus has {n_tokens} tokens; seq_len={seq_len} needs at least {seq_len + 1}")
    rng = np.random.default_rng([seed, step])
    return rng.integers(0, n_tokens - seq_len, size=global_batch)


def global_batch(corpus: Corpus, seed: int, step: int, global_batch_size: int,
                 seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), each [global_batch, seq_len] int64: targets are inputs shifted by one."""
    offs = batch_offsets(seed, step, global_batch_size, len(corpus), seq_len)
    idx = offs[:, None] + np.arange(seq_len + 1)[None, :]
    seqs = corpus.tokens[idx].astype(np.int64)
    return seqs[:, :-1], seqs[:, 1:]


def rank_microbatches(corpus: Corpus, seed: int, step: int, global_batch_size: int, seq_len: int,
                      dp: int, dp_rank: int, microbatches: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """This DP rank's contiguous slice of the global batch, cut into `microbatches` pieces."""
    x, y = global_batch(corpus, seed, step, global_batch_size, seq_len)
    per = global_batch_size // dp
    x, y = x[dp_rank * per:(dp_rank + 1) * per], y[dp_rank * per:(dp_rank + 1) * per]
    mb = per // microbatches
    return [(x[i * mb:(i + 1) * mb], y[i * mb:(i + 1) * mb]) for i in range(microbatches)]
