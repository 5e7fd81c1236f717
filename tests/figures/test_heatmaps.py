"""Heatmaps: the drawn image is the trace's numbers, labels are the trace's labels, scales are
centred and shared."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
import xarray as xr
from matplotlib.colors import SymLogNorm

from depthscope.errors import DepthscopeError
from depthscope.figures import plot_heatmap, plot_heatmap_grid
from depthscope.figures.heatmaps import symlog_ticks
from depthscope.probes import capture
from depthscope.trace import select_model, stack_traces
from tests.helpers import build, perturb, random_tokens, tiny

SCHEMES = ("standard", "denseformer", "attnres", "dca")


def perturbed_trace(scheme: str, seed: int = 0, **size) -> xr.Dataset:
    """Trace of a tiny model whose mixer parameters are moved off their uniform initialisation."""
    cfg = tiny(scheme, **size)
    model = perturb(build(cfg, seed=seed), 0.5, seed + 7)
    return capture(model, random_tokens(cfg, batch=2, pos=16))


def planted(n_blocks: int, signed: bool = True) -> xr.DataArray:
    """A (layer, source) mixing array of a standard layout with signed values and NaN above."""
    src = ["embed"] + [f"{i}.{k}" for i in range(n_blocks) for k in ("attn", "mlp")]
    lay = src[1:] + ["readout"]
    n = len(src)
    rng = np.random.default_rng(n_blocks)
    m = np.where(np.tri(n, dtype=bool), rng.normal(0, 0.4, (n, n)), np.nan)
    if not signed:
        m = np.abs(m)
    return xr.DataArray(
        m,
        dims=("layer", "source"),
        coords={"layer": lay, "source": src},
        name="mixing",
        attrs={"long_name": "effective depth-mixing weight M[l, s] (token mean)", "units": "1"},
    )


@pytest.fixture(scope="module")
def traces() -> dict[str, xr.Dataset]:
    return {s: perturbed_trace(s) for s in SCHEMES}


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def image(ax) -> np.ma.MaskedArray:
    return np.ma.asarray(ax.images[0].get_array())


def assert_image_is(ax, values: np.ndarray) -> None:
    """Masked exactly where values are NaN, equal to them everywhere else."""
    arr = image(ax)
    assert arr.shape == values.shape
    np.testing.assert_array_equal(np.ma.getmaskarray(arr), np.isnan(values))
    np.testing.assert_array_equal(arr.data[~np.isnan(values)], values[~np.isnan(values)])


def shown(labels) -> list[str]:
    return [t.get_text() for t in labels]


def full_labels(axis, n: int) -> list[str]:
    fmt = axis.get_major_formatter()
    return [fmt(i) for i in range(n)]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_image_is_mixing_with_nan_masked(traces, scheme):
    t = traces[scheme]
    ax = plot_heatmap(t)
    assert_image_is(ax, t["mixing"].values)
    assert shown(ax.get_xticklabels()) == list(t["source"].values)
    assert shown(ax.get_yticklabels()) == list(t["layer"].values)
    assert ax.get_title() == scheme


@pytest.mark.parametrize("scheme", SCHEMES)
def test_norm_is_centred_on_zero_at_the_largest_magnitude(traces, scheme):
    t = traces[scheme]
    norm = plot_heatmap(t).images[0].norm
    vmax = float(np.nanmax(np.abs(t["mixing"].values)))
    assert norm.vmin == -norm.vmax
    assert norm.vmax == pytest.approx(vmax)
    assert float(norm(0.0)) == pytest.approx(0.5)


def test_standard_residual_is_all_top_of_a_symmetric_scale(traces):
    t = traces["standard"]
    ax = plot_heatmap(t)
    norm = ax.images[0].norm
    assert (norm.vmin, norm.vmax) == (-1.0, 1.0)
    np.testing.assert_allclose(norm(image(ax).compressed()), 1.0)


def test_variable_and_dataarray_inputs_agree(traces):
    t = traces["attnres"]
    share = t["contribution_share"]
    a = plot_heatmap(t, var="contribution_share")
    b = plot_heatmap(share.transpose("source", "layer"))  # dims are put back in (layer, source) order
    assert_image_is(a, share.values)
    assert_image_is(b, share.values)
    assert a.images[0].colorbar.ax.get_ylabel() == b.images[0].colorbar.ax.get_ylabel()


def test_colorbar_label_is_long_name_and_units(traces):
    t = traces["dca"]
    for var in ("mixing", "contribution_share"):
        label = plot_heatmap(t, var=var).images[0].colorbar.ax.get_ylabel()
        flat = " ".join(label.split())  # the label is wrapped onto lines at spaces
        assert t[var].attrs["long_name"] in flat
    assert flat.endswith("[fraction]")


def test_explicit_vmax_and_planted_signed_values():
    da = planted(3)
    ax = plot_heatmap(da, vmax=2.5)
    assert (ax.images[0].norm.vmin, ax.images[0].norm.vmax) == (-2.5, 2.5)
    assert_image_is(ax, da.values)


def test_symlog_uses_symlognorm_with_the_denseformer_ticks():
    da = planted(3)
    da = da / np.nanmax(np.abs(da.values))  # range exactly +-1, as in the paper's figure
    ax = plot_heatmap(da, symlog=True)
    norm = ax.images[0].norm
    assert isinstance(norm, SymLogNorm)
    assert norm.linthresh == 0.05
    assert norm.vmin == -norm.vmax == -1.0
    ticks = ax.images[0].colorbar.get_ticks()
    mags = [1.0, math.exp(-1), math.exp(-2), 0.05]
    np.testing.assert_allclose(sorted(ticks), sorted([0.0] + mags + [-m for m in mags]))
    labels = [t.get_text() for t in ax.images[0].colorbar.ax.get_yticklabels()]
    assert {"1", "0.368", "0.135", "0.05", "-0.05", "0"} <= {lb.replace("\u2212", "-") for lb in labels}


def test_symlog_ticks_follow_the_range():
    assert symlog_ticks(0.2) == pytest.approx([-math.exp(-2), -0.05, 0.0, 0.05, math.exp(-2)])
    assert max(symlog_ticks(3.0)) == pytest.approx(math.e)
    assert symlog_ticks(0.01) == [0.0]


def test_annotations_are_the_finite_values():
    da = planted(2)
    ax = plot_heatmap(da, annotate=True)
    finite = da.values[np.isfinite(da.values)]
    assert [t.get_text() for t in ax.texts] == [f"{v:.2f}" for v in finite]


@pytest.mark.parametrize("n_blocks", [30, 48])
def test_deep_model_labels_are_grouped_by_block(n_blocks):
    """A deep model's ticks name blocks by their number alone (one label per shown block at its first
    cell, the first and last blocks included), a minor mark at every block; embed and read-out keep
    their names; one style along the whole axis, and the axis label says so."""
    da = planted(n_blocks)  # 2n+1 sources, 2n+1 consumers (30 blocks: SmolLM2's 61 x 61)
    ax = plot_heatmap(da)
    for axis, dim, ticklabels in (
        (ax.xaxis, "source", ax.get_xticklabels()),
        (ax.yaxis, "layer", ax.get_yticklabels()),
    ):
        labels = [str(v) for v in da[dim].values]
        visible = [t for t in shown(ticklabels) if t]
        assert 10 <= len(visible) <= 41
        named = [t for t in visible if not t.isdigit()]
        assert named == [x for x in (labels[0], labels[-1]) if "." not in x]  # embed / read-out by name
        blocks = [int(t) for t in visible if t.isdigit()]
        assert blocks == sorted(blocks) and blocks[-1] == n_blocks - 1  # the last block, by its number
        firsts = [i for i, x in enumerate(labels) if x.endswith(".attn")]  # each block's first cell
        marks = set(axis.get_minorticklocs()) | set(axis.get_majorticklocs())
        ends = {i for i in (0, len(labels) - 1) if "." not in labels[i]}
        assert marks == set(firsts) | ends  # a mark at every block and at embed / read-out
        for loc, text in zip(axis.get_majorticklocs(), (t.get_text() for t in ticklabels)):
            assert text, f"tick at {loc} without a label"
            if text.isdigit():
                assert labels[int(loc)] == f"{text}.attn"  # the block's first cell
        assert "ticks: blocks" in (ax.get_xlabel() if dim == "source" else ax.get_ylabel())
    if n_blocks == 30:  # room for a label on every cell: block 0 beside embed is named too
        assert shown(ax.get_xticklabels())[:2] == ["embed", "0"] and shown(ax.get_yticklabels())[0] == "0"


def test_small_models_show_every_label():
    da = planted(3)
    ax = plot_heatmap(da)
    assert full_labels(ax.xaxis, 7) == shown(ax.get_xticklabels()) == list(da["source"].values)
    assert len(ax.xaxis.get_minorticklocs()) == 0


def test_several_schemes_need_the_grid(traces):
    stacked = stack_traces([traces["standard"], traces["attnres"]])
    with pytest.raises(DepthscopeError, match="heatmap_grid"):
        plot_heatmap(stacked)
    one = stack_traces([traces["dca"], traces["attnres"]]).isel(model=[0])
    ax = plot_heatmap(one)
    assert_image_is(ax, traces["dca"]["mixing"].values)  # padding rows and columns dropped
    assert ax.get_title() == "dca"


def test_grid_has_one_unpadded_panel_per_scheme_on_one_scale(traces):
    ts = [traces[s] for s in SCHEMES]
    stacked = stack_traces(ts)
    fig = plot_heatmap_grid(stacked, "mixing")
    panels, cbar = fig.axes[: len(ts)], fig.axes[-1]
    assert len(fig.axes) == len(ts) + 1
    assert [ax.get_title() for ax in panels] == list(SCHEMES)
    vmax = max(float(np.nanmax(np.abs(t["mixing"].values))) for t in ts)
    for ax, t, label in zip(panels, ts, SCHEMES):
        own = select_model(stacked, label)["mixing"]
        assert own.shape == t["mixing"].shape  # DCA keeps its q/k/v rows, the others lose them
        assert_image_is(ax, t["mixing"].values)
        assert full_labels(ax.yaxis, t.sizes["layer"]) == list(t["layer"].values)
        assert (ax.images[0].norm.vmin, ax.images[0].norm.vmax) == pytest.approx((-vmax, vmax))
    assert "effective depth-mixing weight" in " ".join(cbar.get_ylabel().split())


def test_grid_of_a_stack_matches_its_traces_and_dedupes_labels(traces):
    ts = [traces["attnres"], traces["dca"], traces["attnres"]]
    fig = plot_heatmap_grid(stack_traces(ts), "contribution_share", symlog=True)
    panels = fig.axes[:3]
    assert [ax.get_title() for ax in panels] == ["attnres", "dca", "attnres#2"]
    norms = [ax.images[0].norm for ax in panels]
    assert all(isinstance(n, SymLogNorm) for n in norms)
    assert len({(n.vmin, n.vmax) for n in norms}) == 1
    for ax, t in zip(panels, ts):
        assert_image_is(ax, t["contribution_share"].values)
    # the same panels from a list of 2-D arrays, titled by their label
    arrays = [t["contribution_share"].assign_attrs(label=f"m{i}") for i, t in enumerate(ts)]
    listed = plot_heatmap_grid(arrays, symlog=True)
    assert [ax.get_title() for ax in listed.axes[:3]] == ["m0", "m1", "m2"]
    for a, b in zip(panels, listed.axes[:3]):
        assert_image_is(b, image(a).filled(np.nan))


def test_grid_layout_and_explicit_vmax(traces):
    ts = [traces[s] for s in ("standard", "attnres", "denseformer")]
    fig = plot_heatmap_grid(stack_traces(ts), "mixing", ncols=2, vmax=3.0)
    assert len(fig.axes) == 4
    rows = {round(ax.get_position().y0, 3) for ax in fig.axes[:3]}
    assert len(rows) == 2
    assert all(ax.images[0].norm.vmax == 3.0 for ax in fig.axes[:3])


def test_grid_of_row_normalised_weights(traces):
    """The cross-model grid of |M| / row sum: a standard residual reads exactly 1/n_l, on a log
    scale (the default for ``row_normalized``)."""
    from matplotlib.colors import LogNorm

    from depthscope.analysis.dilution import n_available, row_normalized

    ts = [traces[s] for s in SCHEMES]
    fig = plot_heatmap_grid(row_normalized(stack_traces(ts)))
    for ax, t in zip(fig.axes[: len(ts)], ts):
        np.testing.assert_allclose(image(ax).filled(np.nan), row_normalized(t).values, rtol=1e-12)
        assert isinstance(ax.images[0].norm, LogNorm)
    std = traces["standard"]
    np.testing.assert_allclose(
        image(fig.axes[0]).filled(np.nan),
        (1.0 / n_available(std)).broadcast_like(std["mixing"]).where(std["mixing"].notnull()).values,
    )
    assert "row-normalised" in " ".join(fig.axes[-1].get_ylabel().split())


def test_heatmap_draws_an_estimators_output_into_the_given_axes(traces):
    """The primitive takes a DataArray and a user's Axes; a trace's variable by name is the same."""
    from matplotlib.figure import Figure

    from depthscope.analysis.dilution import block_view, row_normalized

    t = traces["attnres"]
    ax = Figure().subplots()
    assert plot_heatmap(row_normalized(t), ax, colorbar=False) is ax
    assert_image_is(ax, row_normalized(t).values)
    assert ax.get_title() == "" and ax.get_xlabel() == "source"  # a bare DataArray has no label
    by_name = plot_heatmap(t, Figure().subplots(), var="mixing")
    assert_image_is(
        by_name, plot_heatmap(t["mixing"], Figure().subplots()).images[0].get_array().filled(np.nan)
    )
    blocks = plot_heatmap(block_view(t), Figure().subplots(), var="contribution_share")
    assert_image_is(blocks, block_view(t)["contribution_share"].values)
    assert (blocks.get_xlabel(), blocks.get_ylabel()) == ("source block", "consumer block")
    with pytest.raises(DepthscopeError, match="no variable 'nope'"):
        plot_heatmap(t, var="nope")
