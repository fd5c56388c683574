"""Sampling is a pure function of (seed, step) and the sequences of a step do not depend on the
layout: the DP slices and micro-batches of any (dp, m) reassemble the same global batch."""

from __future__ import annotations

import numpy as np
import pytest

from par3d.data import Corpus, decode, encode, global_batch, rank_microbatches


@pytest.fixture(scope="module")
def corpus():
    return Corpus.load(limit=200_000)


def test_default_corpus_is_python_source(corpus):
    assert len(corpus) == 200_000
    text = decode(corpus.tokens[:5000])
    assert "def " in text or "import " in text


def test_tokenizer_round_trip():
    s = "héllo, wörld\n"
    assert decode(encode(s)) == s


def test_sampling_is_deterministic_and_targets_are_shifted(corpus):
    x1, y1 = global_batch(corpus, 0, 5, 8, 32)
    x2, _ = global_batch(corpus, 0, 5, 8, 32)
    x3, _ = global_batch(corpus, 0, 6, 8, 32)
    assert np.array_equal(x1, x2) and not np.array_equal(x1, x3)
    assert np.array_equal(x1[:, 1:], y1[:, :-1])


@pytest.mark.parametrize("dp,m", [(1, 1), (2, 1), (2, 4), (4, 2), (8, 2)])
def test_layout_does_not_change_the_sequences_of_a_step(corpus, dp, m):
    gx, gy = global_batch(corpus, 3, 7, 16, 24)
    pieces = [mb for d in range(dp) for mb in rank_microbatches(corpus, 3, 7, 16, 24, dp, d, m)]
    assert np.array_equal(np.concatenate([p[0] for p in pieces]), gx)
    assert np.array_equal(np.concatenate([p[1] for p in pieces]), gy)


def test_data_path_file_and_folder(tmp_path):
    (tmp_path / "a.txt").write_text("abc" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("xyz" * 100)
    assert len(Corpus.load(str(tmp_path / "a.txt"))) == 300
    assert len(Corpus.load(str(tmp_path))) == 600
    with pytest.raises(ValueError, match="seq_len=64 needs at least 65"):
        global_batch(Corpus.load(str(tmp_path / "a.txt"), limit=10), 0, 0, 2, 64)
