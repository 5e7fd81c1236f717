"""Deep models stay readable: thinned tick labels that never overlap, a block-level view, figures
that grow with the model (a tiny random 24-block model: 49 consumers x 49 sources)."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np
import pytest

from depthscope.analysis.dilution import block_view, row_normalized
from depthscope.probes import capture
from tests.figures import planned_figures
from tests.helpers import build, perturb, random_tokens, tiny


@pytest.fixture(scope="module")
def deep():
    cfg = tiny("attnres", n_layers=24, d_model=16)
    return capture(perturb(build(cfg), 0.3, 1), random_tokens(cfg, batch=2), rank=True)


def overlapping(labels, renderer) -> list[tuple[str, str]]:
    boxes = [
        (t.get_text(), t.get_window_extent(renderer)) for t in labels if t.get_visible() and t.get_text()
    ]
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


def test_no_tick_labels_overlap_in_any_report_figure(deep):
    shallow = capture(build(tiny("standard")), random_tokens(tiny(), batch=2), rank=True)
    figures = [(spec, draw()) for spec, draw in planned_figures([deep, shallow], k=2)]
    checked = 0
    for spec, fig in figures:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                clash = overlapping(axis.get_ticklabels(), renderer)
                assert not clash, f"{spec.name}: {clash[:3]}"
                checked += 1
        plt.close(fig)
    assert checked > 20


def test_the_overlap_check_sees_crowded_labels():
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.set_xticks(range(60), [f"{i}.attn" for i in range(60)])
    fig.canvas.draw()
    assert overlapping(ax.get_xticklabels(), fig.canvas.get_renderer())
    plt.close(fig)


def test_deep_model_section_adds_a_block_view_and_grows(deep):
    shallow = capture(build(tiny("standard")), random_tokens(tiny(), batch=2))
    figures = {s.name: draw() for s, draw in planned_figures([deep, shallow], k=2)}
    big, small = figures["model-attnres"], figures["model-standard"]
    assert len(big.axes) == 3 + 3 and len(small.axes) == 2 + 2  # panels and their colour bars
    assert big.get_size_inches()[1] > small.get_size_inches()[1]
    assert big.axes[2].get_xlabel() == "source block"
    # the block view's image is block_view's shares: 24 blocks + embed columns, 24 + read-out rows
    image = big.axes[2].images[0].get_array()
    assert image.shape == (25, 25)
    np.testing.assert_allclose(image.filled(np.nan), block_view(deep)["contribution_share"].values)
    plt.close("all")


def test_block_view_rows_still_sum_to_one(deep):
    b = block_view(deep)
    np.testing.assert_allclose(b["contribution_share"].sum("source"), 1.0, atol=1e-5)
    np.testing.assert_allclose(row_normalized(b).sum("source"), 1.0)
    # a block's total |M| is the sum of its sources' |M|
    np.testing.assert_allclose(
        b["mixing_abs"].sel(layer="readout", source="3"),
        deep["mixing_abs"].sel(layer="readout", source=["3.attn", "3.mlp"]).sum(),
    )


def test_block_view_of_a_plain_residual_is_k_over_n_and_its_departure_is_one():
    """A standard residual (unit weights) at block level: counted by hand from the labels, block B's
    weight at consumer block b is the mean over b's consumers of (B's sources it reads) / (all the
    sources it reads): the embedding reads half an earlier block, the diagonal only b.attn from b.mlp.
    Shares planted at exactly 1/n_l have a block departure of exactly 1 on every readable cell."""
    from depthscope.analysis.dilution import dilution_index

    cfg = tiny("standard", n_layers=6)
    t = capture(build(cfg), random_tokens(cfg, batch=2))
    b = block_view(t)
    sources = [str(s) for s in t["source"].values]
    readable = t["mixing"].notnull().values
    for consumer_block in b["layer"].values:
        rows = [j for j, lab in enumerate(t["layer"].values) if str(lab).split(".")[0] == str(consumer_block)]
        for source_block in b["source"].values:
            cols = [k for k, s in enumerate(sources) if s.split(".")[0] == str(source_block)]
            want = np.mean([readable[r, cols].sum() / readable[r].sum() for r in rows])
            got = float(row_normalized(b).sel(layer=consumer_block, source=source_block))
            if want == 0:
                assert np.isnan(got), (consumer_block, source_block)
            else:
                assert got == pytest.approx(want, rel=1e-12), (consumer_block, source_block)
    assert float(row_normalized(b).sel(layer="3", source="embed")) == pytest.approx(
        float(row_normalized(b).sel(layer="3", source="1")) / 2, rel=1e-12
    )
    uniform = t.copy()
    uniform["contribution_share"] = (1.0 / t["mixing"].notnull().sum("source")).where(t["mixing"].notnull())
    departure = dilution_index(block_view(uniform))
    np.testing.assert_allclose(departure.values[np.isfinite(departure.values)], 1.0, rtol=1e-12)
    assert np.isfinite(departure.values).sum() == np.isfinite(row_normalized(b).values).sum()
