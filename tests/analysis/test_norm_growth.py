"""The residual norm growth (``norm_growth``, ``norm_growth_ratio``) beside the share-based dilution
index: planted traces whose every value is known by hand, a captured float32 model against an
independent float64 oracle from ``run_with_cache``, NaN where the trace holds no input norms, and
the report and ``depthscope dilution`` showing it.

Every comparison is written ``err <= tol`` (or ``==``), so a NaN fails it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from depthscope.analysis import dilution as est
from depthscope.probes import capture
from depthscope.schemes import consumers
from depthscope.trace import stack_traces
from tests.analysis.test_dilution import LAYERS, MIX, NAN, SHARE, SOURCES, planted
from tests.helpers import build, perturb, random_tokens, tiny

U32 = 2.0**-24  # float32 unit roundoff


def with_rms(rms, trace=None, label="planted") -> xr.Dataset:
    t = planted(MIX, SHARE, LAYERS, SOURCES, label=label) if trace is None else trace
    return t.assign(input_rms=("layer", np.asarray(rms, dtype=float)))


# --- planted traces ------------------------------------------------------------------------------


def test_planted_norm_growth_is_each_input_rms_over_the_first():
    """Consumers 0.attn, 0.mlp, 1.attn, readout with input RMS 2, 3, 8, 4: growth 1, 1.5, 4, 2;
    the last sublayer input is 1.attn (the read-out is not a layer's input): ratio 4."""
    t = with_rms([2.0, 3.0, 8.0, 4.0])
    g = est.norm_growth(t)
    assert g.dims == ("layer",) and g.attrs["units"] == "1" and "magnitude" in g.attrs["long_name"]
    assert g.values.tolist() == [1.0, 1.5, 4.0, 2.0]  # exact: every value a power-of-two ratio
    assert float(est.norm_growth_ratio(t)) == 4.0
    # where the dilution index is reported, the ratio is too
    assert float(est.summary(t, k=1)["norm_growth_ratio"]) == 4.0
    assert est.consumer_table(t)["norm_growth"].values.tolist() == [1.0, 1.5, 4.0, 2.0]
    f = est.findings(t)
    assert (f["norm_growth_ratio"], f["norm_growth_from"], f["norm_growth_to"]) == (4.0, "0.attn", "1.attn")
    c = est.dilution_curves(t)
    assert c["norm_growth"].values.tolist() == [1.0, 1.5, 4.0, 2.0]
    assert list(c["norm_growth"]["layer_depth"].values) == [1, 2, 3, 4]
    assert float(c["norm_growth_ratio"]) == 4.0


def test_the_first_consumer_is_exactly_one_whatever_its_rms():
    for first in (1e-30, 0.0123456789, 7.0, 3.3e20):
        g = est.norm_growth(with_rms([first, 2.0, 3.0, 5.0]))
        assert g.values[0] == 1.0, first
        assert est.dilution_curves(with_rms([first, 2.0, 3.0, 5.0]))["norm_growth"].values[0] == 1.0


def test_views_of_the_first_input_share_their_mean_rms():
    """DCA's q/k/v rows of the first attention input: the reference is their mean RMS (the point
    ``by_depth`` draws), so the curve's first depth is 1; the last input is 1.mlp."""
    layers = ["0.attn.q", "0.attn.k", "0.attn.v", "0.mlp", "1.attn", "1.mlp", "readout"]
    sources = ["embed", "0.attn", "0.mlp", "1.attn", "1.mlp"]
    mix = np.full((7, 5), NAN)
    for i, n in enumerate([1, 1, 1, 2, 3, 4, 5]):
        mix[i, :n] = 1.0
    share = mix / np.nansum(mix, axis=1, keepdims=True)
    kinds = ["attn", "attn", "attn", "mlp", "attn", "mlp", "readout"]
    t = planted(mix, share, layers, sources, layer_kinds=kinds, label="views")
    t = t.assign(input_rms=("layer", np.array([1.0, 2.0, 3.0, 4.0, 6.0, 10.0, 12.0])))
    g = est.norm_growth(t)
    assert g.values.tolist() == [0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 6.0]  # over (1 + 2 + 3) / 3 = 2
    curve = est.dilution_curves(t)["norm_growth"]
    assert curve.values.tolist() == [1.0, 2.0, 3.0, 5.0, 6.0]
    f = est.findings(t)
    assert (f["norm_growth_ratio"], f["norm_growth_from"], f["norm_growth_to"]) == (5.0, "0.attn", "1.mlp")


def test_a_stack_gives_each_model_its_own_growth():
    a = with_rms([2.0, 3.0, 8.0, 4.0], label="a")
    b = with_rms([0.5, 1.0, 4.0, 64.0], label="b")
    short = planted(
        [[1.0, NAN], [0.5, 0.5]],
        [[1.0, NAN], [0.4, 0.6]],
        ["0.attn", "readout"],
        ["embed", "0.attn"],
        layer_kinds=["attn", "readout"],
        label="short",
    ).assign(input_rms=("layer", np.array([3.0, 9.0])))
    stacked = stack_traces([a, b, short])
    g = est.norm_growth(stacked)
    assert set(g.dims) == {"model", "layer"}
    assert g.sel(model="a").values.tolist() == [1.0, 1.5, 4.0, 2.0]
    assert g.sel(model="b").values.tolist() == [1.0, 2.0, 8.0, 128.0]
    assert g.sel(model="short", layer=["0.attn", "readout"]).values.tolist() == [1.0, 3.0]
    assert np.isnan(g.sel(model="short", layer=["0.mlp", "1.attn"]).values).all()  # not its rows: NaN
    ratio = est.norm_growth_ratio(stacked)
    assert ratio.dims == ("model",)
    assert ratio.values.tolist() == [4.0, 8.0, 1.0]  # short: its only sublayer input is first and last
    s = est.summary(stacked, k=1)
    assert s["norm_growth_ratio"].values.tolist() == [4.0, 8.0, 1.0]
    c = est.dilution_curves(stacked)
    assert c["norm_growth_ratio"].values.tolist() == [4.0, 8.0, 1.0]
    assert c["norm_growth"].sel(model="b").values.tolist() == [1.0, 2.0, 8.0, 128.0]


# --- NaN where the trace holds no input norms ---------------------------------------------------


def test_nan_without_input_norms():
    t = planted(MIX, SHARE, LAYERS, SOURCES).drop_vars("input_rms")
    assert np.isnan(est.norm_growth(t).values).all() and est.norm_growth(t).sizes["layer"] == 4
    assert np.isnan(float(est.norm_growth_ratio(t)))
    assert np.isnan(float(est.summary(t, k=1)["norm_growth_ratio"]))
    assert np.isnan(est.findings(t)["norm_growth_ratio"])
    assert np.isnan(est.dilution_curves(t)["norm_growth"].values).all()
    assert np.isnan(float(est.norm_growth_ratio(est.block_view(with_rms([1.0, 2.0, 3.0, 4.0])))))
    # a zero first input is no reference either, never a guess
    assert np.isnan(est.norm_growth(with_rms([0.0, 2.0, 3.0, 4.0])).values).all()
    # a stack where one model lacks them: that model NaN, the other its own numbers
    stacked = stack_traces([with_rms([2.0, 3.0, 8.0, 4.0], label="a"), t.assign_attrs(label="none")])
    ratio = est.norm_growth_ratio(stacked)
    assert ratio.sel(model="a") == 4.0 and np.isnan(float(ratio.sel(model="none")))


# --- a captured model against an independent oracle ----------------------------------------------

# the capture sums |h|^2 per batch as one float32 dot product (``Accumulator.sq``) into float64:
# of n non-negative terms, relative error <= gamma_n = n u / (1 - n u). An RMS is the square root
# (half that), and a ratio of two RMS at most the sum of both halves: gamma_n, to first order.
BATCH, POS = 4, 32


def _tolerance(d_model: int) -> float:
    n = BATCH * POS * d_model  # one batch: every window at once
    return 1.01 * n * U32 / (1 - n * U32)


def oracle_growth(model, tokens) -> tuple[dict[str, float], float]:
    """Each consumer's input RMS over the first sublayer input's, from plain ``run_with_cache`` on
    the model's consumer inputs, in float64: (per consumer label, last sublayer over first)."""
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    cs = consumers(model.cfg)
    rms = {c.label: float(cache[c.hook_in].double().pow(2).mean().sqrt()) for c in cs}
    sub = [c.label for c in cs if c.label != "readout"]
    block = [label.split(".")[0] + "." + label.split(".")[1] for label in sub]  # a view is its input
    first = np.mean([rms[s] for s, b in zip(sub, block) if b == block[0]])
    last = np.mean([rms[s] for s, b in zip(sub, block) if b == block[-1]])
    return {label: r / first for label, r in rms.items()}, last / first


@pytest.mark.parametrize("scheme", ["standard", "hc", "dca", "denseformer"])
def test_a_captured_model_equals_the_oracle(scheme):
    """A perturbed float32 model (growth well above 1: the sublayers write sizeable outputs); the
    trace's norm growth per consumer and its ratio equal the float64 oracle within the float32
    sum's bound; the first consumer is exactly 1 (a DCA view: its by-depth point)."""
    cfg = tiny(scheme)
    model = perturb(build(cfg), scale=0.3, others=0.2)
    tokens = random_tokens(cfg, batch=BATCH, pos=POS)
    trace = capture(model, tokens, batch_size=BATCH, progress=False)
    want, want_ratio = oracle_growth(model, tokens)
    got = est.norm_growth(trace)
    tol = _tolerance(cfg.d_model)
    assert tol < 2e-4  # the bound is informative at this size
    for label in map(str, trace["layer"].values):
        err = abs(float(got.sel(layer=label)) / want[label] - 1)
        assert err <= tol, (scheme, label, err, tol)
    ratio = float(est.norm_growth_ratio(trace))
    err = abs(ratio / want_ratio - 1)
    assert err <= tol, (scheme, err, tol)
    assert ratio > 2.0, ratio  # a real growth, not the initialisation's ~1
    curve = est.dilution_curves(trace)["norm_growth"]
    if scheme == "dca":  # three views at the first depth: their mean RMS is the reference
        assert abs(float(curve.values[0]) - 1.0) <= 4 * np.finfo(float).eps
    else:
        assert got.values[0] == 1.0 and curve.values[0] == 1.0
    if scheme == "hc":  # the read-out sums 4 streams: far above the last layer's input, not the ratio
        assert float(got.sel(layer="readout")) > 2 * ratio


# --- the report and the command line --------------------------------------------------------------


def test_the_report_draws_the_norm_growth_and_tabulates_the_ratio():
    from depthscope.figures import interactive as ia
    from depthscope.pipelines.report_data import report_data
    from depthscope.pipelines.report_settings import ReportSettings

    traces = []
    for scheme, others in (("standard", 0.2), ("attnres", 0.1)):
        cfg = tiny(scheme)
        model = perturb(build(cfg), scale=0.3, others=others)
        traces.append(capture(model, random_tokens(cfg, batch=2, pos=32), batch_size=2, progress=False))
    data, stacked = report_data(traces, [], ReportSettings(k=2))
    [fig] = [f for f in data.figures() if f.kind == "norm-growth"]
    names = [f.spec.name for f in data.figures()]
    assert names.index("norm-growth") == names.index("dilution") + 1
    curves = est.dilution_curves(stacked)
    drawn = fig.draw()
    ax = drawn.axes[0]
    for line, label in zip(ax.lines, ["standard", "attnres"]):
        want = curves["norm_growth"].sel(model=label).dropna("layer_depth")
        np.testing.assert_array_equal(line.get_xydata()[:, 1], want.values)
        ratio = float(curves["norm_growth_ratio"].sel(model=label))
        assert line.get_label() == f"{label} (last / first {ratio:.2f}x)"
    assert ax.get_yscale() == "log"
    charts = fig.charts(ia.Charts())
    assert len(charts) == 1
    # the summary table's cell is summary's ratio, per model
    [table] = [c for s in data.sections if s.anchor == "scores" for c in s.content if hasattr(c, "rows")]
    assert "norm_growth" in [c.key for c in table.columns]
    for row, t in zip(table.rows, traces):
        want = float(est.summary(t)["norm_growth_ratio"])
        assert abs(want - 1) > 0.1 and row["norm_growth"] == want, (row["model"], row["norm_growth"], want)


def test_depthscope_dilution_prints_the_ratio_beside_the_index(tmp_path, capsys):
    from depthscope.cli import main
    from depthscope.trace import save_trace

    cfg = tiny("standard")
    t = capture(perturb(build(cfg), others=0.2), random_tokens(cfg), batch_size=2, progress=False)
    path = save_trace(t, tmp_path / "t.nc")
    capsys.readouterr()
    assert main(["dilution", str(path)]) == 0
    printed = capsys.readouterr().out
    ratio = float(est.norm_growth_ratio(t))
    assert ratio > 1.5
    assert f"residual norm growth {ratio:.2f}x" in printed and "(2.mlp) over the first's (0.attn)" in printed
