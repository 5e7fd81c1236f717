"""Property tests (hypothesis) over random small configs of every scheme variant, off initialisation.

Each named variant (``schemes.base.variants()``) is drawn with random sizes (1-3 blocks, width 8-32
split into 1-2 heads of even size, context 8-16) and either its own options (fitted to the size) or
random options of its scheme within their valid ranges; every weight is then moved away from its
initialisation. Four properties must hold for every draw: causality over the sequence, the exact
delta basis, a trace whose shares sum to 1 with a small residual error, and a trace that does not
depend on how the tokens are split into batches.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from depthscope.probes import capture
from depthscope.schemes import ModelConfig
from depthscope.schemes.base import variants
from tests.helpers import build, perturb, random_tokens, reconstruct

VARIANTS = {label: (scheme, opts) for label, scheme, opts in variants()}
EXAMPLES = settings(max_examples=12, deadline=None, derandomize=True)


def random_options(scheme: str, n_layers: int, ctx: int) -> st.SearchStrategy[dict]:
    """Options of ``scheme`` drawn within their valid ranges for this size."""
    n_sublayers = 2 * n_layers  # (shortswa on the sequence axis adds a third; 2 per block is a lower bound)
    small = st.integers(1, 3)
    return {
        "standard": st.just({}),
        "ddl": st.just({}),
        "denseformer": st.fixed_dictionaries({"dilation": small, "period": small}),
        "dca": st.fixed_dictionaries(
            {"grn": st.sampled_from(["dca", "v1", "v2", "v3"]), "k": st.none() | small}
        ),
        "attnres": st.fixed_dictionaries({"blocks": st.none() | st.integers(1, n_sublayers)}),
        "hc": st.fixed_dictionaries(
            {"streams": st.integers(1, 4), "mode": st.sampled_from(["dynamic", "static"])}
        ),
        "mhc": st.fixed_dictionaries({"streams": st.integers(2, 4), "sinkhorn_iters": st.integers(1, 20)}),
        "shc": st.fixed_dictionaries({"streams": st.integers(2, 4)}),
        "frac": st.fixed_dictionaries(
            {"fracs": st.sampled_from([1, 2]), "mode": st.sampled_from(["dynamic", "static"])}
        ),
        "muddformer": st.fixed_dictionaries({"hidden": st.sampled_from([0, 4, 8])}),
        "value-residual": st.fixed_dictionaries({"mode": st.sampled_from(["value", "x0"])}),
        "depth-attention": st.just({}),
        "moda": st.fixed_dictionaries({"norm": st.sampled_from(["pre", "post"])}),
        "shortswa": st.sampled_from(["depth", "sequence"]).flatmap(
            lambda axis: st.fixed_dictionaries(
                {"axis": st.just(axis), "window": st.integers(1, ctx if axis == "sequence" else 6)}
            )
        ),
    }[scheme]


def fit(scheme: str, options: dict, n_layers: int, ctx: int) -> dict:
    """A named variant's options, shrunk where they do not fit a model this small."""
    opts = dict(options)
    if scheme == "attnres" and opts.get("blocks") is not None:
        opts["blocks"] = min(opts["blocks"], 2 * n_layers)
    if scheme == "shortswa" and opts.get("axis") == "sequence":
        opts["window"] = min(opts.get("window", 4), ctx)
    return opts


@st.composite
def configs(draw, label: str) -> tuple[ModelConfig, int]:
    """(a random small config of variant ``label``, a seed for its weights)."""
    scheme, own = VARIANTS[label]
    n_layers = draw(st.integers(1, 3))
    n_heads = draw(st.integers(1, 2))
    d_model = n_heads * draw(st.sampled_from([h for h in range(2, 33, 2) if 8 <= n_heads * h <= 32]))
    ctx = draw(st.integers(8, 16))
    # a third of the draws keep the variant's own options, the rest draw random ones
    own_options = draw(st.integers(0, 2), label="own options") == 0
    options = fit(scheme, own, n_layers, ctx) if own_options else draw(random_options(scheme, n_layers, ctx))
    if scheme == "frac" and d_model % options.get("fracs", 4):  # the fractions must divide d_model
        options = {**options, "fracs": 2}
    cfg = ModelConfig(
        scheme=scheme, n_layers=n_layers, d_model=d_model, n_heads=n_heads, ctx=ctx, options=options
    )
    return cfg, draw(st.integers(0, 2**16))


def moved(cfg: ModelConfig, seed: int, dtype=torch.float64):
    """The model of ``cfg`` with every weight moved off its initialisation (mixers most)."""
    return perturb(build(cfg, seed=seed, dtype=dtype), scale=0.3, seed=seed, others=0.05)


@pytest.mark.parametrize("label", list(VARIANTS))
@EXAMPLES
@given(data=st.data())
def test_changing_a_future_token_leaves_earlier_logits_unchanged(label, data):
    cfg, seed = data.draw(configs(label))
    model = moved(cfg, seed)
    t = data.draw(st.integers(0, cfg.ctx - 2), label="last unchanged position")
    tokens = random_tokens(cfg, batch=2, seed=seed)
    changed = tokens.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1 + seed % 255) % 256
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=0)


@pytest.mark.parametrize("label", list(VARIANTS))
@EXAMPLES
@given(data=st.data())
def test_every_input_is_exactly_its_delta_basis_sum(label, data):
    cfg, seed = data.draw(configs(label))
    model = moved(cfg, seed)
    for consumer, (h, rebuilt) in reconstruct(model, random_tokens(cfg, batch=2, seed=seed)).items():
        assert h.dtype == torch.float64
        err = float((h - rebuilt).abs().max())
        assert err <= 1e-9 * max(1.0, float(h.abs().max())), f"{cfg}: {consumer} off by {err:.2e}"


@pytest.mark.parametrize("label", list(VARIANTS))
@EXAMPLES
@given(data=st.data())
def test_trace_shares_sum_to_one_and_rebuild_every_input(label, data):
    cfg, seed = data.draw(configs(label))
    trace = capture(moved(cfg, seed, torch.float32), random_tokens(cfg, batch=3, seed=seed), batch_size=3)
    sums = trace["contribution_share"].sum("source")  # NaN cells (unwritten sources) are skipped
    np.testing.assert_allclose(sums.values, 1.0, rtol=0, atol=1e-6, err_msg=str(cfg))
    assert float(trace["residual_error"].max()) < 1e-4, str(cfg)
    # unavailable cells are NaN, never 0: consumer l sees exactly the sources written before it
    available = trace["mixing"].notnull().sum("source").values
    assert list(available) == sorted(available) and available[-1] == trace.sizes["source"]


@pytest.mark.parametrize("label", list(VARIANTS))
@EXAMPLES
@given(data=st.data())
def test_streaming_in_batches_of_one_equals_one_batch(label, data):
    cfg, seed = data.draw(configs(label))
    model = moved(cfg, seed)  # float64: the comparison sees the accumulator, not float32 rounding
    tokens = random_tokens(cfg, batch=3, seed=seed)
    whole = capture(model, tokens, batch_size=3, rank=True)
    streamed = capture(model, tokens, batch_size=1, rank=True)
    assert whole.attrs["tokens"] == streamed.attrs["tokens"] == tokens.numel()
    # the convergence check's half spectrum is the even batches' by definition: one batch has none,
    # three batches of one keep batches 0 and 2
    assert "source_spectrum_half" not in whole
    half = streamed["source_spectrum_half"]
    assert half.attrs["tokens"] == 2 * tokens.shape[1]
    xr.testing.assert_allclose(whole, streamed.drop_vars("source_spectrum_half"), rtol=1e-6)


@pytest.mark.parametrize("label", list(VARIANTS))
@EXAMPLES
@given(data=st.data())
def test_sharded_states_merged_in_rank_order_equal_one_process(label, data):
    """What a data-parallel capture does, without the processes: W shards (batch b to shard
    b % W), each run alone, their states merged in shard order, equal one run over every batch to
    1e-12 (the gloo path itself: tests/probes/test_scale.py)."""
    from depthscope.probes.adapters import resolve
    from depthscope.probes.capture import Run
    from depthscope.probes.settings import CaptureSettings

    cfg, seed = data.draw(configs(label))
    world = data.draw(st.integers(2, 3), label="world size")
    model = moved(cfg, seed, torch.float32)
    ad = resolve(model)
    chunks = random_tokens(cfg, batch=5, seed=seed).split(1)
    one, shards = (
        Run(ad, CaptureSettings(rank=True, logits=True), 0, cfg.ctx),
        [Run(ad, CaptureSettings(rank=True, logits=True), 0, cfg.ctx) for _ in range(world)],
    )
    with torch.no_grad():
        for b, chunk in enumerate(chunks):
            one.batch(model, chunk, b)
            shards[b % world].batch(model, chunk, b)
    merged = Run(ad, CaptureSettings(rank=True, logits=True), 0, cfg.ctx)
    for shard in shards:
        merged.merge(shard.state())
    a, b = one.dataset({}), merged.dataset({})
    for name in a.data_vars:
        x, y = a[name].values, b[name].values
        scale = np.nanmax(np.abs(x)) if np.isfinite(x).any() else 0.0
        np.testing.assert_allclose(y, x, rtol=1e-12, atol=1e-12 * scale, err_msg=f"{cfg}: {name}")
