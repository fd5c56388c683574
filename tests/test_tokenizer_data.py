"""`--tokenizer` (a Hugging Face tokenizer.json through `tokenizers`): documents packed with the
end-of-text token, tokenized once into a memory-mapped .bin next to the text (or in the cache
folder when that is not writable), reused while the text is unchanged.  The tokenizer is trained
here on a few lines (no download)."""

from __future__ import annotations

import os

import numpy as np
import pytest

tokenizers = pytest.importorskip("tokenizers")

from par3d import data, hf  # noqa: E402
from par3d.data import Corpus  # noqa: E402


@pytest.fixture()
def tok(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<|endoftext|>"])
    t.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer=trainer)
    path = tmp_path / "tokenizer.json"
    t.save(str(path))
    return str(path)


def _docs(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.txt").write_text("the quick brown fox")
    (d / "b.txt").write_text("jumps over the lazy dog")
    return d


def test_documents_packed_with_end_of_text(tmp_path, tok):
    d = _docs(tmp_path)
    c = Corpus.load(str(d), tok)
    t = hf.HFTokenizer(tok)
    want = t.encode("the quick brown fox") + [t.eot] + t.encode("jumps over the lazy dog") + [t.eot]
    assert c.tokens.tolist() == want
    assert c.eot == t.eot == t.tok.token_to_id("<|endoftext|>") and c.vocab == t.vocab
    assert isinstance(c.tokens, np.memmap) and c.tokens.dtype == np.uint16


def test_tokenized_once_and_reused_while_unchanged(tmp_path, tok, monkeypatch):
    d = _docs(tmp_path)
    first = Corpus.load(str(d), tok).tokens.tolist()
    bins = [f for f in os.listdir(tmp_path) if f.endswith(".bin")]
    assert len(bins) == 1 and bins[0].startswith("docs.par3d-")  # next to the text, not inside the folder

    def boom(self, text):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(hf.HFTokenizer, "encode", boom)
    assert Corpus.load(str(d), tok).tokens.tolist() == first  # the .bin is reused
    (d / "b.txt").write_text("jumps over the lazy dog again and again")
    with pytest.raises(AssertionError, match="tokenized again"):
        Corpus.load(str(d), tok)  # a changed text is tokenized again
    monkeypatch.undo()
    assert len(Corpus.load(str(d), tok).tokens) > len(first)


def test_cache_folder_when_the_text_folder_is_not_writable(tmp_path, tok, monkeypatch):
    d = _docs(tmp_path)
    cache = tmp_path / "cache"
    orig = data._cache_paths
    monkeypatch.setattr(data, "_cache_paths",
                        lambda p, t: ["/proc/par3d-not-writable/x.bin", orig(p, t)[1]])
    monkeypatch.setenv("PAR3D_CACHE", str(cache))
    c = Corpus.load(str(d), tok)
    assert len(c) > 0 and any(f.endswith(".bin") for f in os.listdir(cache))


def test_byte_default_is_unchanged(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"hello bytes")
    c = Corpus.load(str(f))
    assert c.tokens.tobytes() == b"hello bytes" and c.vocab == 256 and c.eot is None


def test_bad_tokenizer_is_a_clear_error(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="not a readable tokenizer.json"):
        Corpus.load(str(tmp_path), str(bad))
