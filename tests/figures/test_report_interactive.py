"""The report's interactive charts: the data they hold is the estimators' output (rounded to 4
significant digits), each estimator runs once, and every chart is a valid Vega-Lite spec."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from depthscope import zoo
from depthscope.analysis import dilution
from depthscope.analysis.dilution import row_normalized
from depthscope.figures import interactive as ia
from depthscope.figures.data import unpadded
from depthscope.pipelines.report import ReportSettings
from depthscope.pipelines.report_data import report_data
from depthscope.trace import load_trace, split_models, stack_traces

REFERENCE = Path(__file__).parent.parent / "fixtures" / "reference"


@pytest.fixture(scope="module")
def traces():
    pair = [load_trace(REFERENCE / f"{name}.nc") for name in ("attnres", "dca")]
    return split_models(stack_traces(pair))


@pytest.fixture(scope="module")
def trajectories():
    return [load_trace(zoo.ZOO_DIR / "trajectories" / f"{n}.nc") for n in ("hc", "mhc")]


def rows(entry: dict) -> list[dict]:
    """What the page's script makes of a data entry (report.js: ``rows``)."""
    cols = entry["columns"]
    return [
        {k: (c["dict"][c["idx"][r]] if isinstance(c, dict) else c[r]) for k, c in cols.items()}
        for r in range(entry["n"])
    ]


def test_rounding_keeps_four_significant_digits():
    assert ia.rounded(0.0123456) == 0.01235 and ia.rounded(123456.0) == 123500.0 and ia.rounded(0) == 0.0
    assert ia.rounded(float("nan")) is None
    x = np.random.default_rng(0).lognormal(size=1000) * 10.0 ** np.random.default_rng(1).integers(-8, 8, 1000)
    r = np.array([ia.rounded(v) for v in x])
    assert np.all(np.abs(r - x) <= 5e-4 * np.abs(x))  # half a unit in the 4th digit


def test_a_heatmap_holds_each_models_own_cells(traces):
    stacked = stack_traces(traces)
    da = row_normalized(stacked)
    entry, labels, _ = ia.heatmap_data(da)
    cells = rows(entry)
    for t in traces:
        label = str(t.attrs["label"])
        want = unpadded(row_normalized(t)).transpose("layer", "source")
        mine = [c for c in cells if c["m"] == label]
        assert labels[label]["y"] == [str(v) for v in want["layer"].values]
        assert len(mine) == int(np.isfinite(want.values).sum())  # the unavailable cells are left out
        got = np.full(want.shape, np.nan)
        for c in mine:
            got[c["i"], c["j"]] = c["v"]
            assert (c["l"], c["s"]) == (labels[label]["y"][c["i"]], labels[label]["x"][c["j"]])
        np.testing.assert_allclose(got, want.values, rtol=5e-4, equal_nan=True)


@pytest.fixture(scope="module")
def built(traces, trajectories):
    """The page's data of two models and two runs, and every call of ``summary`` made for it."""
    import depthscope.pipelines.report_data as rd

    calls = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rd, "summary", lambda t, k=2: calls.append(t) or dilution.summary(t, k))
        data, _ = report_data(list(traces), list(trajectories), ReportSettings())
    return data, calls


def test_summary_runs_once_per_model_and_run(traces, trajectories, built):
    data, calls = built
    assert len(calls) == len(traces) + len(trajectories)
    names = [f.spec.name for f in data.figures()]
    assert len(names) == len(set(names))


def test_every_chart_is_valid_vega_lite(built):
    import vl_convert

    data, _ = built
    out = ia.Charts()
    for fig in data.figures():
        fig.charts(out)
    assert len(out.charts) >= 20 and len({c.id for c in out.charts}) == len(out.charts)
    doc = json.loads(out.payload(data.models))
    assert doc["models"] == ["attnres", "dca"]
    for chart in doc["charts"]:
        spec = {**chart["spec"], "data": {"values": rows(doc["data"][chart["data"]])}}
        vega = vl_convert.vegalite_to_vega(spec)  # raises on an invalid spec
        assert vega["marks"], chart["id"]


def test_the_payload_cannot_close_its_script():
    out = ia.Charts()
    out.data["x"] = ia.columns({"m": ["</script><script>alert(1)</script>"], "v": [1.0]})
    text = out.payload(["<b>&"])
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text)["data"]["x"]["columns"]["m"]["dict"] == ["</script><script>alert(1)</script>"]
