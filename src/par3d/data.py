"""Tokenizers, a corpus that exists on every machine, and layout-free sampling.

The default corpus is the source text of the Python standard library that runs par3d (the
`.py` files next to `os.py`, in sorted order, up to `DEFAULT_CORPUS_BYTES`): no download, and
real text with structure a small GPT can learn.

Tokenizers: bytes by default (token = byte, vocabulary 256, no download; a single text file is
memory-mapped as it is).  `--tokenizer PATH` takes a Hugging Face `tokenizer.json` (through the
`tokenizers` library, the `hf` extra): every file of --data is a document, documents are packed
back to back with the tokenizer's end-of-text token after each, and the token ids are written
ONCE to a `.bin` next to the text (or, when that folder is not writable, to the cache folder
$PAR3D_CACHE, default ~/.cache/par3d) and memory-mapped; the `.bin` is reused while the text
files and the tokenizer are unchanged (sizes and modification times, and a hash of tokenizer.json).

Sampling is a pure function of (seed, step): step k's global batch is the same list of
sequences whatever the layout.  A DP rank takes a contiguous slice of it and cuts that slice
into micro-batches, so the set of sequences a step trains on never depends on dp, pp or tp.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from par3d.textcheck import binary_reason, text_files

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


# the names end-of-text goes by in common tokenizer.json files (GPT-2, Llama 2, Llama 3, Gemma, ...)
EOT_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")
_CACHE_TAG = ".par3d-"


def _doc_files(path: str) -> list[str]:
    """The text files of a folder (binary ones, e.g. __pycache__'s, skipped; textcheck.py), or the file."""
    if os.path.isdir(path):
        return [f for f in text_files(path)[0] if _CACHE_TAG not in os.path.basename(f)]
    return [path]


def _refuse_binary(path: str | None) -> None:
    if path is not None and os.path.isfile(path):
        why = binary_reason(path)
        if why:
            raise ValueError(f"data={path!r} is not text: it {why}; give a text file")


def _cache_paths(path: str, tok: Any) -> list[str]:
    """Where the token .bin may live: next to the text, else in the cache folder."""
    name = os.path.basename(os.path.normpath(path)) + f"{_CACHE_TAG}{tok.digest}.bin"
    here = os.path.join(os.path.dirname(os.path.abspath(os.path.normpath(path))), name)
    cache = os.environ.get("PAR3D_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "par3d")
    key = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:12]
    return [here, os.path.join(cache, f"{key}-{name}")]


def _stamp(files: list[str], tok: Any) -> dict[str, Any]:
    return {"tokenizer": tok.digest, "eot": tok.eot,
            "files": [[os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns] for f in files]}


def tokenized(path: str, tok: Any) -> tuple[np.ndarray, str]:
    """The token ids of the documents under `path` (memory-mapped), tokenizing only when no
    up-to-date .bin exists.  Returns (tokens, the .bin's path)."""
    files = _doc_files(path)
    stamp = _stamp(files, tok)
    dtype = np.uint16 if tok.vocab <= 1 << 16 else np.uint32
    candidates = _cache_paths(path, tok)
    for bin_path in candidates:
        try:
            with open(bin_path + ".json", encoding="utf-8") as fh:
                if json.load(fh) == stamp and os.path.getsize(bin_path) > 0:
                    return np.memmap(bin_path, dtype=dtype, mode="r"), bin_path
        except (OSError, ValueError):
            continue
    ids: list[int] = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            ids.extend(tok.encode(fh.read()))
        ids.append(tok.eot)  # documents packed back to back, each closed by end-of-text
    arr = np.asarray(ids, dtype=dtype)
    for bin_path in candidates:
        try:
            os.makedirs(os.path.dirname(bin_path), exist_ok=True)
            # written under temporary names and renamed: ranks tokenizing at once never see half a file
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(bin_path), prefix=".par3d-tmp-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(arr.tobytes())
            os.replace(tmp, bin_path)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(bin_path), prefix=".par3d-tmp-")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(stamp, fh)
            os.replace(tmp, bin_path + ".json")
            return np.memmap(bin_path, dtype=dtype, mode="r"), bin_path
        except OSError:
            continue
    return arr, ""


@dataclass
class Corpus:
    tokens: np.ndarray  # uint8 (bytes) or uint16/uint32 (a tokenizer's ids), possibly memory-mapped
    source: str
    vocab: int = VOCAB  # the tokenizer's vocabulary
    eot: int | None = None  # end-of-text id (None: bytes, no separator)

    @staticmethod
    def load(path: str | None = None, tokenizer: str | None = None, limit: int | None = None) -> Corpus:
        if tokenizer is not None:
            from par3d.hf import HFTokenizer  # the Hugging Face edge

            tok = HFTokenizer(tokenizer)
            _refuse_binary(path)
            if path is None:
                raise ValueError("--tokenizer needs --data (the default corpus is bytes)")
            if not os.path.exists(path):
                raise ValueError(f"data={path!r} does not exist")
            tokens, _ = tokenized(path, tok)
            if limit is not None:
                tokens = tokens[:limit]
            if len(tokens) == 0:
                raise ValueError(f"data={path!r} holds no text; give a non-empty text file or folder")
            return Corpus(tokens, path, tok.vocab, tok.eot)
        if path is None:
            return Corpus(np.frombuffer(_read_paths(_stdlib_files(), limit or DEFAULT_CORPUS_BYTES),
                                        dtype=np.uint8), "python-stdlib")
        _refuse_binary(path)
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            mm = np.memmap(path, dtype=np.uint8, mode="r")  # bytes are tokens: the file as it is
            return Corpus(mm[:limit] if limit is not None else mm, path)
        if os.path.isdir(path):
            data = _read_paths(_doc_files(path), limit)
        else:
            data = _read_paths([path], limit)
        if not data:
            raise ValueError(f"data={path!r} holds no text; give a non-empty text file or folder")
        return Corpus(np.frombuffer(data, dtype=np.uint8), path)

    def __len__(self) -> int:
        return len(self.tokens)


def eval_batch(corpus: Corpus, index: int, batch: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Evaluation batch `index`: sequences index·batch .. (index+1)·batch-1 of the text cut into
    consecutive, non-overlapping windows of seq_len tokens (targets: the next token of each)."""
    first, n = index * batch, len(corpus)
    need = (first + batch) * seq_len + 1
    if need > n:
        raise ValueError(f"evaluation batch {index} needs {need} tokens of data, it has {n}; use fewer "
                         f"--eval-batches, a smaller --global-batch or more text")
    starts = (first + np.arange(batch)) * seq_len
    seqs = corpus.tokens[starts[:, None] + np.arange(seq_len + 1)[None, :]].astype(np.int64)
    return seqs[:, :-1], seqs[:, 1:]


def eval_tokens_needed(eval_batches: int, batch: int, seq_len: int) -> int:
    return eval_batches * batch * seq_len + 1


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
