"""``depthscope plot``: one publication figure of a trace, its choices from the command line and from
Python (the quantity, a model of a stack, consumer and source selections, blocks, scales)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from matplotlib.colors import LogNorm, TwoSlopeNorm

from depthscope import zoo
from depthscope.analysis.dilution import dilution_index, row_normalized
from depthscope.analysis.select import pick, quantity
from depthscope.cli import main
from depthscope.figures.heatmaps import plot_heatmap
from depthscope.trace import load_trace, save_trace, stack_traces
from tests.test_hostile import assert_one_error_line, run

ZOO_TRAJECTORY = zoo.ZOO_DIR / "trajectories" / "standard.nc"  # five steps of one run, stacked


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """The last step of the bundled standard run as a trace file of one model."""
    from depthscope.trace import split_models

    path = tmp_path_factory.mktemp("plot") / "standard.nc"
    save_trace(split_models(load_trace(ZOO_TRAJECTORY))[-1], path)
    return path


def test_plot_writes_a_pdf_and_an_svg_with_a_layer_selection(one, tmp_path, capsys):
    for name in ("fig.pdf", "fig.svg"):
        out = tmp_path / name
        args = ["plot", str(one), "--out", str(out), "--layers", "attn,readout", "--sources", "embed,0-3"]
        assert main([*args, "--size", "3.5,3"]) == 0
        head = out.read_bytes()[:200]
        assert head.startswith(b"%PDF") if name.endswith("pdf") else b"<svg" in head or b"<?xml" in head
    said = capsys.readouterr().out
    assert "caption:" in said and "1/n_l" in said
    assert "only the sources selected are drawn, so a row here sums to less than 1" in said
    assert b"1/n_l" in (tmp_path / "fig.svg").read_bytes()  # the caption, in the file's description


@pytest.mark.parametrize(
    "var, says, never",
    [
        ("weights", "reads k/n_l for a block of k sources", "reads 1/n_l"),
        ("share", "each row sums to 1", "sums to less"),
        ("departure", "over its uniform share (k/n_l", "times the number of sources"),
    ],
)
def test_the_block_views_caption_says_what_a_block_cell_is(one, tmp_path, capsys, var, says, never):
    assert main(["plot", str(one), "--out", str(tmp_path / "b.svg"), "--blocks", "--var", var]) == 0
    said = capsys.readouterr().out
    assert says in said and never not in said and "per block" in said


def test_the_selection_keeps_what_it_names_in_order(one):
    t = load_trace(one)
    da = pick(pick(quantity(t, "weights"), "layer", "attn,readout"), "source", "embed,2-3")
    assert list(da.layer.values) == [f"{i}.attn" for i in range(8)] + ["readout"]
    assert list(da.source.values) == ["embed", "2.attn", "2.mlp", "3.attn", "3.mlp"]
    np.testing.assert_array_equal(da.values, row_normalized(t).sel(layer=da.layer, source=da.source).values)
    assert list(pick(quantity(t, "share"), "layer", ["7", "readout"]).layer.values) == [
        "7.attn",
        "7.mlp",
        "readout",
    ]


def test_the_quantities_are_the_estimators(one):
    t = load_trace(one)
    xr.testing.assert_equal(quantity(t, "departure").drop_attrs(), dilution_index(t).drop_attrs())
    xr.testing.assert_equal(quantity(t, "share").drop_attrs(), t["contribution_share"].drop_attrs())
    blocks = quantity(t, "share", blocks=True)
    np.testing.assert_allclose(blocks.sum("source"), 1.0, atol=1e-9)  # a block view's rows still sum to 1
    assert quantity(t, "weights").attrs["long_name"] == "row-normalised weight"  # short, no formula


def test_departure_is_centred_at_one_and_vmin_is_honoured_on_every_scale(one):
    t = load_trace(one)
    ax = plot_heatmap(quantity(t, "departure"), center=1.0)
    norm = ax.images[0].norm
    assert isinstance(norm, TwoSlopeNorm) and norm.vcenter == 1.0
    assert plot_heatmap(t["mixing"], vmin=0.2, vmax=1.5).images[0].norm.vmin == 0.2  # linear
    assert plot_heatmap(t["mixing"], vmin=-0.3, symlog=True).images[0].norm.vmin == -0.3
    log = plot_heatmap(quantity(t, "weights"), log=True, vmin=1e-3).images[0].norm
    assert isinstance(log, LogNorm) and log.vmin == 1e-3


def test_a_stacked_trace_needs_a_model(tmp_path):
    out = tmp_path / "f.png"
    rc, err = run(["plot", ZOO_TRAJECTORY, "--out", out])
    assert_one_error_line(rc, err, "--model")
    assert (
        main(
            ["plot", str(ZOO_TRAJECTORY), "--out", str(out), "--model", "standard@4000", "--var", "departure"]
        )
        == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "extra, word",
    [
        (["--out", "f.jpg"], ".pdf, .svg or .png"),
        (["--out", "f.pdf", "--layers", "9.attn"], "9.attn"),
        (["--out", "f.pdf", "--cmap", "no-such-map"], "no-such-map"),
        (["--out", "f.pdf", "--size", "3"], "W,H"),
        (["--out", "f.pdf", "--model", "other"], "other"),
    ],
)
def test_mistakes_are_one_line_and_write_nothing(one, tmp_path, extra, word):
    extra = [str(tmp_path / e) if e.startswith("f.") else e for e in extra]
    rc, err = run(["plot", one, *extra])
    assert_one_error_line(rc, err)
    assert word in err and list(tmp_path.iterdir()) == []


def test_a_stack_of_two_models_plots_the_one_asked_for(one, tmp_path):
    t = load_trace(one)
    other = t.copy().assign_attrs(label="other")
    path = tmp_path / "two.nc"
    save_trace(stack_traces([t, other]), path)
    assert main(["plot", str(path), "--out", str(tmp_path / "o.svg"), "--model", "other", "--blocks"]) == 0


def test_a_deep_models_ticks_are_grouped_by_block_and_fit_the_figure():
    """61 sources (SmolLM2's 30 blocks) at 7 x 6 in: one tick per shown block, never more labels than
    the side has room for, the embedding and the read-out always named, every block by its number."""
    labels = ["embed", *[f"{b}.{k}" for b in range(30) for k in ("attn", "mlp")]]
    rows = [*labels[1:], "readout"]
    da = xr.DataArray(
        np.random.default_rng(0).random((61, 61)),
        dims=("layer", "source"),
        coords={"layer": rows, "source": labels},
    )
    ax = plot_heatmap(da, figsize=(7, 6))
    ax.figure.canvas.draw()
    for axis, names, inches in ((ax.xaxis, labels, 7), (ax.yaxis, rows, 6)):
        shown = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
        assert [shown[0], shown[-1]] == [
            n.split(".")[0] for n in (names[0], names[-1])
        ]  # embed, 0; 29, readout
        assert all(s.isdigit() for s in shown[1:-1])  # blocks, not sublayers
        assert 5 <= len(shown) <= inches / 0.14


def test_what_the_figures_docstrings_name_is_exported():
    """plot_heatmap's docstring sends users to ``analysis.block_view``; it and the plot choices are
    in ``depthscope.analysis``."""
    import depthscope.analysis as analysis
    from depthscope.analysis import dilution, select

    assert analysis.block_view is dilution.block_view
    assert analysis.pick is select.pick and analysis.quantity is select.quantity
    assert set(analysis.QUANTITIES) == {"weights", "mixing", "share", "departure"}
