"""Whole per-feature weights with each window's first positions cut (``probes.terms.Windows``): the
spans cover every kept token once, in order, none crossing a window's end, and each span's rows are
the cut weights' own rows."""

from __future__ import annotations

import pytest
import torch

from depthscope.probes.terms import Windows


@pytest.mark.parametrize("window, skip, step", [(16, 1, 4), (16, 3, 5), (7, 2, 32), (9, 0, 2)])
def test_spans_cover_every_kept_token_and_rows_are_the_cut_weights(window, skip, step):
    g = torch.Generator().manual_seed(window + skip)
    w = torch.randn(3, window, 4, 5, generator=g)
    win = Windows.of(w, skip)
    cut = w[:, skip:].flatten(0, 1)  # what the capture cut and flattened before: a copy
    assert torch.equal(win.full(), cut)
    spans = win.spans(step)
    assert [t for a, b in spans for t in range(a, b)] == list(range(cut.shape[0]))
    assert all(b - a <= step and a // (window - skip) == (b - 1) // (window - skip) for a, b in spans)
    for a, b in spans:
        assert torch.equal(win.rows(a, b), cut[a:b])
        assert win.rows(a, b).untyped_storage().data_ptr() == w.untyped_storage().data_ptr()  # a view
    with pytest.raises(ValueError, match="cross the end"):
        win.rows(window - skip - 1, window - skip + 1)
