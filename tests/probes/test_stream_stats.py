"""The stream-statistics probe: on our HC and mHC its sums equal a direct computation from streams
rebuilt out of plain hooks (sources and native stream matrices); on the transformers families
(DeepSeek-V4, GLM-5-Next, Hunyuan-V4, Qwen4-Exp) they equal the same computation from each
hyper-connection's input streams and read weights recomputed here from the modules' parameters
(plain forward hooks, the weights checked against the read each module computed); on static HC
its |H_res - I|_F equals the trace's; DeepSeek-V4 and Qwen4-Exp streams rebuild every read they
feed."""

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


# --- transformers families: the sums against the same statistics from plain hooks ---

HF_FAMILIES = ("deepseek_v4", "glm5_next", "hy_v4", "qwen4_exp")


def _hf_family(family: str, seed: int = 0):
    """A tiny random model of ``family`` (the adapter tests' configs), its mixing parameters spread
    so that the streams, their read weights and the comb matrices differ; three rows of 12 tokens.
    """
    if family in ("deepseek_v4", "qwen4_exp"):
        model, _ = _tiny_hf(f"test_{family}", seed)
        from importlib import import_module

        return model, import_module(f"tests.probes.adapters.test_{family}").tokens(3, 12)
    from tests.probes.adapters import test_hyper_forms as forms

    torch.manual_seed(seed)
    model = forms.perturb(forms.BUILDERS[family][0](), seed=seed)
    return model.eval(), forms.tokens(3, 12)


def _unit_rms(flat: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean x^2 + eps) over the last axis (kept), float64."""
    return (flat.pow(2).mean(-1, keepdim=True) + eps).rsqrt()


def _hyper_read(module, streams: torch.Tensor, out) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(pre [batch, pos, stream], comb or None, the read the module computed) of a DeepSeek-V4-form
    hyper-connection or head, pre recomputed in float64 from the transformers equations:
    sigmoid(scale (fn vec(h)) / rms(vec(h)) + base) + eps (DeepSeek-V4 normalises before the
    projection, Hunyuan-V4 after it: the same linear logits); GLM-5-Next's head is the plain mean.
    """
    n = streams.shape[-2]
    flat = streams.flatten(2).double()
    if isinstance(out, tuple):  # a sublayer's hyper-connection: (post, comb, collapsed) or (post, collapsed)
        z = (flat @ module.fn.double()[:n].T) * _unit_rms(flat, module.input_norm.eps)
        pre = torch.sigmoid(z * module.scale.double()[0] + module.base.double()[:n]) + module.hc_eps
        return pre, (out[1].double() if len(out) == 3 else None), out[-1]
    if not hasattr(module, "hc_fn"):  # GLM-5-Next's head: the unweighted mean of the streams
        return torch.full(flat.shape[:2] + (n,), 1.0 / n, dtype=torch.float64), None, out
    z = (flat @ module.hc_fn.double().T) * _unit_rms(flat, module.input_norm.eps)
    pre = torch.sigmoid(z * module.hc_scale.double() + module.hc_base.double()) + module.eps
    return pre, None, out


def hf_hooked_reads(model, tokens) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Per read of the streams, in execution order: (streams [batch, pos, stream, d_model], read
    weights [batch, pos, stream] or per channel [batch, pos, stream, d_model], comb or None), all
    float64, from plain forward hooks on the transformers modules; each read rebuilt from them
    equals what the module computed.
    """
    seen, logits = [], {}

    def hyper(module, args, out):
        seen.append((module, args[0].detach(), out))

    def gate_logits(parent):
        def hook(module, args, out):
            logits[parent] = out.detach()

        return hook

    handles = []
    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith(("HyperConnection", "HyperHead", "GatedResidual")):
            handles.append(module.register_forward_hook(hyper))
        if kind.endswith("GatedResidual"):
            up = module.input_mix_weight_up.register_forward_hook(gate_logits(module))
            handles.append(up)
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    with torch.no_grad():
        return [_rebuilt_read(module, streams, out, logits) for module, streams, out in seen]


def _rebuilt_read(module, streams: torch.Tensor, out, logits: dict):
    """One hooked read: (streams, weights, comb or None) in float64, checked against the module's read."""
    if type(module).__name__.endswith("GatedResidual"):  # Qwen4-Exp: per-channel weights, no comb
        n, d = module.hc_count, module.hidden_size
        h = streams.double().unflatten(-1, (n, d))
        gate = torch.sigmoid(logits.pop(module).double()).unflatten(-1, (n, d))
        gain = 1.0 + module.hc_norm.weight.double().view(n, d)
        weights = gate * gain * _unit_rms(h, module.hc_norm.eps) / n
        comb, computed = None, out[0] if isinstance(out, tuple) else out
        y = (weights * h).sum(-2)
    else:
        h = streams.double()
        weights, comb, computed = _hyper_read(module, streams, out)
        y = (weights.unsqueeze(-1) * h).sum(-2)
    err = float((y - computed.double()).norm() / computed.double().norm())
    assert err < 1e-5, f"a read of {type(module).__name__} not rebuilt: relative error {err:.1e}"
    return h, weights, comb


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_transformers_family_sums_equal_the_statistics_of_the_hooked_streams(family):
    model, tokens = _hf_family(family)
    got = stream_stats(model, tokens, batch_size=2)  # two batches (2 + 1 rows): the sums add up
    reads = hf_hooked_reads(model, tokens)
    labels = [f"{i}.{k}" for i in range(3) for k in ("attn", "mlp")] + ["readout"]  # 3 layers each
    assert list(got.layer.values) == labels and len(reads) == len(labels) == 7
    assert got.attrs["family"] == family
    skip = 1  # the adapters leave out the first position
    flat = lambda t: None if t is None else t[:, skip:].flatten(0, 1).numpy()  # noqa: E731
    n = int(got.attrs["streams"])
    eye = np.eye(n)
    composite = torch.from_numpy(eye).expand(*tokens[:, skip:].shape, n, n)
    for label, (h, weights, comb) in zip(labels, reads):
        want = stream_statistics(flat(h), flat(weights), flat(comb), mixes=label != "readout")
        for name in SUMS:
            w, g = want[name].values, got[name].sel(layer=label).values
            scale = float(np.nanmax(np.abs(w))) if np.isfinite(w).any() else 0.0
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * scale, err_msg=f"{family} {label} {name}")
        if comb is not None:
            composite = composite @ comb[:, skip:]  # source-row: stream s -> t through both
    m = stream_collapse(got)
    p = composite.flatten(0, 1).numpy()
    want_composite = np.sqrt(((p - eye) ** 2).sum((-2, -1))).mean()
    want_uniform = np.sqrt(((p - 1 / n) ** 2).sum((-2, -1))).mean()
    assert float(m.composite_distance) == pytest.approx(want_composite, rel=1e-5, abs=1e-12)
    assert float(m.composite_uniform_distance) == pytest.approx(want_uniform, rel=1e-5)
    mixing = family in ("deepseek_v4", "glm5_next")
    assert (want_composite > 0.1) == mixing  # Hunyuan-V4 and Qwen4-Exp never mix their streams
    # not a trivial case: the streams carry unequal shares of some read, and they are not copies
    spread = m.stream_share.max("stream") - m.stream_share.min("stream")
    assert float(spread.max()) > 0.01, spread.values
    assert float(m.mean_cosine.sel(layer="readout")) < 0.9999
