"""The stream-statistics probe: on our HC and mHC its sums equal a direct computation from streams
rebuilt out of plain hooks (sources and native stream matrices); on static HC its |H_res - I|_F
equals the trace's; DeepSeek-V4 and Qwen4-Exp streams rebuild every read they feed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthscope.analysis.streams import SUMS, stream_collapse, stream_statistics, trace_res_distance
from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.stream_stats import stream_stats
from depthscope.schemes import consumers
from tests.helpers import build, perturb, random_tokens, tiny


def hooked_streams(model, tokens):
    """Per consumer: (label, streams [token, stream, d_model], pre, res) rebuilt from the hooks, and the
    per-token composite of every res: stream s holds sum_j C[s, j] v_j, C <- res^T C, then post.
    """
    _, cache = model.run_with_cache(tokens)
    n = model.cfg.options.streams
    values = [cache["hook_embed"].double()]
    coef = torch.ones(*tokens.shape, n, 1, dtype=torch.float64)
    composite = torch.eye(n, dtype=torch.float64).expand(*tokens.shape, n, n)
    flat = lambda t: t.reshape(-1, *t.shape[2:]).numpy()  # noqa: E731
    reads = []
    for c in consumers(model.cfg):
        h = torch.einsum("bpsn,nbpd->bpsd", coef, torch.stack(values))
        if c.site.kind == "readout":
            reads.append((c.label, flat(h), None, None))
            break
        mix = c.hook_weights.removesuffix("hook_weights")
        pre, res, post = (cache[mix + k].double() for k in ("hook_h_pre", "hook_h_res", "hook_h_post"))
        reads.append((c.label, flat(h), flat(pre), flat(res)))
        coef = torch.cat([res.transpose(-1, -2) @ coef, post.unsqueeze(-1)], dim=-1)
        composite = composite @ res
        values.append(cache[f"blocks.{c.site.block}.hook_{c.site.kind}_out"].double())
    return reads, flat(composite)


@pytest.mark.parametrize(("scheme", "options"), [("hc", {}), ("mhc", {}), ("hc", {"mode": "static"})])
def test_probe_sums_equal_streams_rebuilt_from_hooks(scheme, options):
    cfg = tiny(scheme, options)
    model = perturb(build(cfg, dtype=torch.float64), 0.3, 2)
    tokens = random_tokens(cfg, batch=3)
    got = stream_stats(model, tokens, batch_size=2)  # two batches: the sums add up
    reads, composite = hooked_streams(model, tokens)
    assert list(got.layer.values) == [label for label, *_ in reads]
    for label, h, pre, res in reads:
        want = stream_statistics(h, pre, res, mixes=label != "readout")
        for name in SUMS:
            np.testing.assert_allclose(
                got[name].sel(layer=label).values, want[name].values, rtol=1e-10, atol=1e-12
            )
    eye = np.eye(cfg.options.streams)
    want_composite = np.sqrt(((composite - eye) ** 2).sum((-2, -1))).mean()
    assert float(stream_collapse(got).composite_distance) == pytest.approx(want_composite, rel=1e-10)
    n = cfg.options.streams
    want_uniform = np.sqrt(((composite - 1 / n) ** 2).sum((-2, -1))).mean()
    assert float(stream_collapse(got).composite_uniform_distance) == pytest.approx(want_uniform, rel=1e-10)
    assert float(got.read_error.max()) <= 1e-12  # float64 model: the rebuilt reads are exact
    m = stream_collapse(got)
    np.testing.assert_allclose(m.stream_share.sum("stream").values, 1.0, rtol=1e-12)


def test_static_hc_distances_equal_the_traces():
    cfg = tiny("hc", {"mode": "static"})
    model = perturb(build(cfg), 0.3, 2)
    tokens = random_tokens(cfg, batch=2)
    probe = stream_collapse(stream_stats(model, tokens))
    trace = trace_res_distance(capture(model, tokens))
    sub = [label for label in probe.layer.values if label != "readout"]
    np.testing.assert_allclose(
        trace.res_distance_of_mean.sel(layer=sub).values, probe.res_distance.sel(layer=sub).values, rtol=1e-5
    )
    assert float(trace.composite_distance_of_mean) == pytest.approx(float(probe.composite_distance), rel=1e-5)


def test_one_stream_models_and_bad_tokens_are_refused():
    with pytest.raises(DepthscopeError, match="one residual stream"):
        stream_stats(build(tiny("standard")), random_tokens(tiny("standard")))
    cfg = tiny("hc")
    with pytest.raises(DepthscopeError, match="LongTensor"):
        stream_stats(build(cfg), random_tokens(cfg).float())


def _tiny_hf(module: str, seed: int):
    """The adapter tests' tiny random config, its mixing parameters spread so the streams differ."""
    import importlib

    import transformers

    mod = importlib.import_module(f"tests.probes.adapters.{module}")
    if module == "test_qwen4_exp":
        from transformers.models.qwen4_exp import Qwen4ExpForCausalLM as model_cls
    else:
        model_cls = transformers.DeepseekV4ForCausalLM
    torch.manual_seed(seed)
    model = model_cls(mod.tiny_config())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in ("_hc.", "hc_head.", "hyper_connection")):
                p.add_(torch.randn_like(p) * 0.3)
    return model.eval(), mod.tokens(2, 12)


@pytest.mark.parametrize("module", ["test_deepseek_v4", "test_qwen4_exp"])
def test_transformers_families_rebuild_their_reads(module):
    model, tokens = _tiny_hf(module, 0)
    got = stream_stats(model, tokens)  # refuses a read its streams do not rebuild
    n = int(got.attrs["streams"])
    assert float(got.read_error.max()) <= 1e-4
    assert got.layer.values[-1] == "readout" and got.sizes["layer"] == 2 * 3 + 1
    assert (got.tokens.values == 2 * 11).all()  # the adapter's skipped first position left out
    m = stream_collapse(got)
    np.testing.assert_allclose(m.stream_share.sum("stream").values, 1.0, rtol=1e-10)
    assert ((m.participation_ratio_norm >= 1 - 1e-12) & (m.participation_ratio_norm <= n + 1e-12)).all()
    diag = m.stream_cosine.values[:, range(n), range(n)]
    np.testing.assert_allclose(diag, 1.0, rtol=1e-10)
    if module == "test_qwen4_exp":  # no stream mixing: R = I
        assert (m.res_distance.drop_sel(layer="readout") == 0).all() and float(m.composite_distance) == 0
    else:  # |mean comb - I| <= mean |comb - I| (convexity), the trace's against the probe's
        trace = trace_res_distance(capture(model, tokens))
        sub = [label for label in m.layer.values if label != "readout"]
        assert (trace.res_distance_of_mean.sel(layer=sub) <= m.res_distance.sel(layer=sub) + 1e-6).all()
        assert float(m.composite_distance) > 0


def test_a_read_its_streams_do_not_rebuild_is_refused():
    cfg = tiny("hc")
    model = build(cfg)
    model.blocks[1].attn_mix.hook_in.add_hook(lambda x, hook: x + 1.0)
    try:
        with pytest.raises(DepthscopeError, match=r"read at 1\.attn is not the weighted sum"):
            stream_stats(model, random_tokens(cfg))
    finally:
        model.reset_hooks()
