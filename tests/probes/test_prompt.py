"""``inspect``: one prompt, position by position, exact like every capture: its |h|^2-weighted mean
over positions is ``capture``'s share on the same tokens, for every kind of weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthscope import DepthscopeError
from depthscope.probes import capture, inspect
from tests.helpers import build, tiny
from tests.probes.adapters.spec_models import CTX, VOCAB, seeded

# unit, static, per-token and per-feature weights among them
SCHEMES = ["standard", "denseformer", "attnres", "dca", "hc"]


def weighted_mean(per_pos, rms):
    """The |h|^2-weighted mean over positions of a (pos, layer, source) share."""
    w = (rms**2).values[:, :, None]
    return np.nansum(per_pos.values * w, 0) / w.sum(0)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_weighted_mean_over_positions_is_the_capture(scheme):
    model = build(tiny(scheme))
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(0))
    one = inspect(model, ids)
    trace = capture(model, ids, n_tokens=24, skip_positions=0, progress=False)
    assert one.sizes["pos"] == 24 and list(one.layer.values) == list(trace.layer.values)
    np.testing.assert_allclose(one["contribution_share"].sum("source"), 1.0, atol=1e-5)
    mean = weighted_mean(one["contribution_share"], one["input_rms"])
    avail = np.isfinite(trace["contribution_share"].values)
    np.testing.assert_allclose(mean[avail], trace["contribution_share"].values[avail], atol=1e-6)
    np.testing.assert_allclose(
        one["mixing"].mean("pos").values[avail], trace["mixing"].values[avail], atol=1e-6
    )
    assert float(one["residual_error"].max()) < 1e-4


def test_text_prompts_decode_their_tokens_and_specs_are_read():
    model = build(tiny("standard"))
    one = inspect(model, "def f(x):")
    assert "".join(one["token"].values) == "def f(x):" and one.sizes["pos"] == 9
    nano = seeded("nanogpt")
    ids = torch.randint(0, VOCAB, (CTX,), generator=torch.Generator().manual_seed(1))
    got = inspect(nano, ids, spec=nano.SPEC)
    np.testing.assert_allclose(got["mixing"].sel(layer="readout").dropna("source"), 1.0)  # a plain residual


def test_a_prompt_longer_than_the_context_is_one_clear_error():
    model = build(tiny("standard"))
    with pytest.raises(DepthscopeError, match="context"):
        inspect(model, torch.zeros(model.cfg.ctx + 1, dtype=torch.long))


def test_inspect_from_the_command_line_draws_and_saves(tmp_path, capsys):
    import xarray as xr

    from depthscope.cli import main

    text = "def f(x): return x"
    assert main(["inspect", "attnres", "--text", text, "--out", str(tmp_path / "p.nc")]) == 0
    said = capsys.readouterr().out.strip().splitlines()[-1]
    ds = xr.load_dataset(tmp_path / "p.nc")
    shape = f"{len(text)} positions x {ds.sizes['layer']} consumers x {ds.sizes['source']} sources"
    assert said == f"wrote {tmp_path / 'p.nc'}: {shape}", said
    assert ds.sizes["pos"] == len(text) and "".join(ds["token"].values) == text
    for extra in (["--layer", "readout"], ["--position", "3"]):
        out = tmp_path / f"f{len(extra[1])}.svg"
        assert main(["inspect", "attnres", "--text", text, "--out", str(out), *extra]) == 0
        assert out.stat().st_size > 1000
    assert (
        main(["inspect", "attnres", "--text", text, "--out", str(tmp_path / "x.svg"), "--layer", "9.x"]) == 2
    )
