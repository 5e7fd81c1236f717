"""Corpus loading: the stdlib default, directories, the deterministic split, clear errors."""

from __future__ import annotations

import pytest
import torch

from depthscope.corpus import default_files, eval_windows, load_corpus, sample_batch
from depthscope.errors import CorpusError


def test_default_corpus_is_stdlib_without_tests():
    files = default_files()
    assert len(files) > 300
    assert files == sorted(files)
    assert not any("test" in p.parts[-2:-1] or p.name.startswith("test_") for p in files)
    assert not any("site-packages" in p.parts for p in files)
    corpus = load_corpus()
    assert len(corpus.train) + len(corpus.val) == len(corpus.data)
    assert 0.08 < len(corpus.val) / len(corpus.data) < 0.12


def test_directory_is_read_sorted_recursively_and_skips_binaries(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "2.txt").write_bytes(b"second ")
    (tmp_path / "a.txt").write_bytes(b"first ")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01binary")
    (tmp_path / ".hidden").write_bytes(b"hidden")
    assert load_corpus(tmp_path).data == b"first second "


def test_split_is_deterministic_and_disjoint(tmp_path):
    data = bytes(range(256)) * 2000  # 512 000 bytes = 8 chunks of 64 KiB
    (tmp_path / "c.txt").write_bytes(data)
    c = load_corpus(tmp_path / "c.txt")
    assert len(c.train) + len(c.val) == len(data)
    assert torch.equal(c.val, load_corpus(tmp_path / "c.txt").val)


def test_batches_are_next_byte_pairs():
    data = torch.arange(200, dtype=torch.uint8)
    x, y = sample_batch(data, 4, 16, torch.Generator().manual_seed(0))
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    w = eval_windows(data, 100, 10, seed=3)
    assert w.shape == (10, 10) and torch.equal(w, eval_windows(data, 100, 10, seed=3))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing.txt", "does not exist"),
        (lambda p: (p / "empty.txt").write_bytes(b"") and None or p / "empty.txt", "empty"),
        (lambda p: (p / "d").mkdir() or p / "d", "empty"),
    ],
)
def test_bad_corpus(tmp_path, make, message):
    with pytest.raises(CorpusError, match=message):
        load_corpus(make(tmp_path))


def test_too_short_corpus(tmp_path):
    (tmp_path / "short.txt").write_bytes(b"x" * 50)
    with pytest.raises(CorpusError, match="too short"):
        load_corpus(tmp_path / "short.txt").require(129)


def test_a_tokenizer_that_reads_a_corpus_as_one_id_or_nothing_is_refused():
    """More than 95% of at least 64 ids on one id, or no ids from text: the tokenizer's fault, refused
    with what to pass instead; 94% passes, and a few ids are too few to judge."""
    from depthscope.corpus import Corpus, check_encoding
    from depthscope.errors import DepthscopeError

    corpus = Corpus("c", b"def f(x):\n    return x\n" * 10)
    for n_top, refused in ((96, True), (94, False)):
        ids = torch.cat([torch.full((n_top,), 7), torch.arange(100 - n_top) + 10])
        if refused:
            with pytest.raises(
                DepthscopeError, match=r"almost one token id \(7 is 96.0% of 100 tokens.*pass token ids"
            ):
                check_encoding(ids, corpus)
        else:
            check_encoding(ids, corpus)
    check_encoding(torch.full((63,), 7), corpus)  # too few to judge: the length checks speak instead
    with pytest.raises(DepthscopeError, match="gives no token ids for the text of corpus c"):
        check_encoding(torch.zeros(0, dtype=torch.long), corpus)
    check_encoding(torch.zeros(0, dtype=torch.long), Corpus("blank", b" \n" * 50))  # no text: no ids is right
