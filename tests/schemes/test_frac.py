"""Frac-Connections (arXiv 2503.14125): the standard model at init, an oracle written from the
equations, the trace's shares against it, and the options' checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthscope.errors import ConfigError
from depthscope.probes import capture
from depthscope.schemes import ModelConfig
from tests.helpers import assert_standard_at_init, build, perturb, random_tokens, tiny


def rms(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-6)


def connection(mix, u: torch.Tensor):
    """Gamma, A [.., i, j] and beta [.., j] of one frac-connection for the fractions u [.., m, k],
    from its parameters as the paper's dynamic frac-connections define them."""
    m = mix.gamma.shape[0]
    static_gamma, static_a, static_beta = mix.gamma, mix.a, mix.beta
    if not mix.dynamic:
        return static_gamma, static_a, static_beta
    hb = rms(u) * mix.norm_gain  # H_bar, per fraction
    w_g, w_a, w_b = mix.w_dyn[:m], mix.w_dyn[m : 2 * m], mix.w_dyn[2 * m]
    gamma = mix.s_alpha * torch.tanh(hb @ w_g.T) + static_gamma  # row i: from fraction i's own H_bar
    a = mix.s_alpha * torch.tanh(hb @ w_a.T) + static_a
    beta = mix.s_beta * torch.tanh(hb @ w_b) + static_beta
    return gamma, a, beta


def oracle(model, tokens):
    """Logits and, per consumer, its input's terms [source, batch, pos, d_model]: each source's
    term carried fraction by fraction through x_j = sum_i Gamma[i, j] H_i and
    H'_j = sum_i A[i, j] H_i + beta_j f_j (float64, loops over fractions)."""
    m = model.cfg.options.fracs
    x0 = model.embed(tokens)
    frac = lambda t: list(t.unflatten(-1, (m, -1)).unbind(-2))  # noqa: E731
    whole = lambda fs: torch.cat(fs, dim=-1)  # noqa: E731
    terms = [frac(x0)]  # per source: its term's m fractions
    inputs = []
    for block in model.blocks:
        for kind in block.kinds:
            mix = getattr(block, f"{kind}_mix")
            state = [sum(t[i] for t in terms) for i in range(m)]
            gamma, a, beta = connection(mix, torch.stack(state, dim=-2))
            read = [[sum(gamma[..., i, j, None] * t[i] for i in range(m)) for j in range(m)] for t in terms]
            inputs.append(torch.stack([whole(r) for r in read]))
            out = frac(getattr(block, kind)(whole([sum(r[j] for r in read) for j in range(m)])))
            terms = [[sum(a[..., i, j, None] * t[i] for i in range(m)) for j in range(m)] for t in terms]
            terms.append([beta[..., j, None] * out[j] for j in range(m)])
    inputs.append(torch.stack([whole(t) for t in terms]))
    logits = model.unembed(model.ln_final(inputs[-1].sum(0)))
    return logits, inputs


def test_at_init_frac_connections_are_the_standard_model_bit_for_bit():
    assert_standard_at_init(build(tiny("frac")))


@pytest.mark.parametrize("options", [{}, {"mode": "static"}, {"fracs": 2}])
def test_trace_shares_match_an_oracle_written_from_the_equations(options):
    """Moved off its init, the float64 model's logits equal the oracle's, and the trace's
    shares sum <c_s, h> / sum |h|^2 equal the oracle's terms' to 1e-10 (float64 both)."""
    model = perturb(build(tiny("frac", options), dtype=torch.float64), scale=0.3, others=0.05)
    tokens = random_tokens(model.cfg, batch=2, pos=16)
    with torch.no_grad():
        logits, inputs = oracle(model, tokens)
        torch.testing.assert_close(model(tokens), logits, rtol=0, atol=1e-12)
    trace = capture(model, tokens, batch_size=2, progress=False)
    for i, terms in enumerate(inputs):
        h = terms.sum(0)
        want = ((terms * h).sum((1, 2, 3)) / h.square().sum()).numpy()
        np.testing.assert_allclose(
            trace["contribution_share"].isel(layer=i).values[: len(want)], want, atol=1e-10
        )
    m = model.cfg.options.fracs
    assert trace["frac_res"].shape == (len(inputs), m, m)


def test_static_frac_connections_weigh_every_token_alike():
    model = perturb(build(tiny("frac", {"mode": "static"}), dtype=torch.float64), scale=0.3)
    assert model.scheme.is_static(model.cfg.options)
    _, cache = model.run_with_cache(random_tokens(model.cfg, batch=2, pos=8))
    w = cache["readout_mix.hook_weights"]  # [batch, pos, frac, source, frac]
    torch.testing.assert_close(w, w[:1, :1].expand_as(w), rtol=0, atol=0)


def test_fractions_that_do_not_divide_d_model_are_refused():
    with pytest.raises(ConfigError, match="frac needs fracs >= 1 dividing d_model"):
        ModelConfig(scheme="frac", d_model=36, n_heads=2, options={"fracs": 8})


def test_the_native_figure_draws_a_over_the_fractions_and_their_composite():
    """The report's native figure of a frac trace: panels of the token-mean A (``frac_res``) with
    their values written in the cells, and the composite over depth, the product of the A's."""
    from depthscope.analysis.native import stream_composite
    from depthscope.figures.causal import fraction_matrix, native_figure

    model = perturb(build(tiny("frac")), scale=0.3, others=0.05)
    trace = capture(model, random_tokens(model.cfg, batch=2, pos=16), batch_size=2, progress=False)
    fig = native_figure(trace)
    assert "Frac-Connections" in fig._suptitle.get_text()
    first = fig.axes[0]
    assert first.get_xlabel() == "target fraction"
    res = trace["frac_res"].dropna("layer", how="all")
    want = res.isel(layer=0).values
    assert [t.get_text() for t in first.texts] == [f"{v:.2f}" for v in want.ravel()]
    product = np.linalg.multi_dot(list(res.values))
    np.testing.assert_allclose(stream_composite(fraction_matrix(res)).values, product, rtol=1e-12)
