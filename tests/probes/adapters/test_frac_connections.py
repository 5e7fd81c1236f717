"""Frac-Connections (arXiv 2503.14125) of lucidrains' hyper-connections 0.4.11 (``HyperConnections``
with ``num_fracs`` > 1), read by the hyper-connections adapter as block weights.

The oracle is written from the package's own code, not from depthscope's unrolling: a module's
``width_connection`` and ``depth_connection`` are linear in the streams once its alpha and beta
are fixed, and they are fixed by its norm's output. So each source's term is carried through the
network by calling the package's own two methods on that term alone, with the module's norm made
to return the value it had in the real forward. The terms must add up to every real branch input,
and the captured shares must equal the oracle's."""

from __future__ import annotations

import hyper_connections
import numpy as np
import pytest
import torch
from torch import nn

from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.terms import block_mixing, block_terms
from tests.probes.adapters.test_hyper_connections import DIM, VOCAB, Attention, FeedForward, tokens


class FracNet(nn.Module):
    """embedding -> expand_stream -> (attention, MLP) blocks behind fractional HC -> reduce_stream."""

    def __init__(self, fracs: int, streams: int, depth: int = 2, stream_embed: bool = False):
        super().__init__()
        init, self.expand_stream, self.reduce_stream = (
            hyper_connections.get_init_and_expand_reduce_stream_functions(
                streams, num_fracs=fracs, dim=DIM, add_stream_embed=stream_embed, disable=False
            )
        )
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(
            nn.ModuleList(
                [
                    init(branch=Attention(), layer_index=2 * i),
                    init(branch=FeedForward(), layer_index=2 * i + 1),
                ]
            )
            for i in range(depth)
        )
        self.norm = nn.RMSNorm(DIM)
        self.unembed = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, t):
        x = self.expand_stream(self.embed(t))
        for attn, ff in self.layers:
            x = ff(attn(x))
        return self.unembed(self.norm(self.reduce_stream(x)))


CASES = {  # (fracs, streams, stream embedding)
    "frac-2": (2, 1, False),  # the paper's setting: one stream cut in two
    "frac-4x2": (4, 2, False),  # fractions of several streams
    "frac-2x2-embed": (2, 2, True),  # with the package's stream embedding
}


def moved(fracs: int, streams: int, embed: bool) -> FracNet:
    """A network with every parameter moved off its initialisation (alpha, beta and their dynamic
    projections included, so every matrix depends on the token)."""
    torch.manual_seed(0)
    net = FracNet(fracs, streams, stream_embed=embed).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return net.eval()


def oracle_terms(net: FracNet, t: torch.Tensor) -> list[torch.Tensor]:
    """Per consumer (each module in execution order, then the read-out): its input's terms
    [source, batch, pos, d_model], carried with the package's own width and depth connections."""
    modules = [m for pair in net.layers for m in pair]
    normed, outs = {}, {}
    hooks = [
        m.norm.register_forward_hook(lambda mod, a, o, k=k: normed.__setitem__(k, o))
        for k, m in enumerate(modules)
    ]
    hooks += [
        m.branch.register_forward_hook(lambda mod, a, o, k=k: outs.__setitem__(k, o))
        for k, m in enumerate(modules)
    ]
    with torch.no_grad():
        net(t)
    for h in hooks:
        h.remove()
    e = net.embed(t)
    streams = modules[0].num_residual_streams
    terms = [net.expand_stream(e)]  # the streams as they start: copies of the embedding
    if hasattr(net.expand_stream, "stream_embed"):  # the embedding alone, then each stream embedding
        terms = [terms[0] - _embeds(net, e, None)] + [_embeds(net, e, s) for s in range(streams)]
    got = []
    for k, m in enumerate(modules):
        fixed = normed[k]
        m.norm.forward = lambda x, fixed=fixed: fixed  # alpha and beta as in the real forward
        try:
            with torch.no_grad():
                carried = [m.width_connection(r) for r in terms]
                got.append(torch.stack([x for x, _, _ in carried]))
                beta = carried[0][2]["beta"]
                out = outs[k]
                terms = [m.depth_connection(torch.zeros_like(out), res, **kw) for _, res, kw in carried]
                terms.append(m.depth_connection(out, torch.zeros_like(carried[0][1]), beta=beta))
        finally:
            del m.norm.forward
    got.append(torch.stack([net.reduce_stream(r) for r in terms]))
    return got


def _embeds(net: FracNet, e: torch.Tensor, s: int | None) -> torch.Tensor:
    """The streams' stream-embedding part (all of it, or stream s's alone) in the (batch stream) layout."""
    vectors = net.expand_stream.stream_embed  # [stream, d_model]
    n = vectors.shape[0]
    keep = vectors if s is None else vectors * (torch.arange(n) == s)[:, None].to(vectors)
    return keep.expand(e.shape[0], e.shape[1], n, DIM).permute(0, 2, 1, 3).reshape(-1, e.shape[1], DIM)


@pytest.mark.parametrize("case", list(CASES))
def test_capture_of_frac_connections_matches_the_packages_own_connections(case):
    """Shares of the float64 capture against the oracle's on the same tokens (float64 both: 1e-10),
    and the oracle's terms add up to the real branch inputs (the oracle checks itself)."""
    net = moved(*CASES[case])
    t = tokens(n=2, pos=12)
    trace = capture(net, t, batch_size=2, progress=False)
    layers = [str(x) for x in trace["layer"].values]
    assert len(layers) == 2 * len(net.layers) + 1
    real = {}
    modules = [m for pair in net.layers for m in pair]
    hooks = [
        m.branch.register_forward_pre_hook(lambda mod, a, k=k: real.__setitem__(k, a[0]))
        for k, m in enumerate(modules)
    ]
    with torch.no_grad():
        net(t)
    for h in hooks:
        h.remove()
    for i, terms in enumerate(oracle_terms(net, t)):
        h = terms.sum(0)
        if i < len(modules):
            torch.testing.assert_close(h, real[i], rtol=0, atol=1e-12)
        want = ((terms * h).sum((1, 2, 3)) / h.square().sum()).numpy()
        got = trace["contribution_share"].isel(layer=i).values[: len(want)]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)
    assert "frac_res" in trace and "hc_res" not in trace


def test_block_terms_and_mixing_on_a_planted_example():
    """w mixes source 1's two fractions crosswise and scales source 0: the terms by hand."""
    v = torch.arange(2 * 4, dtype=torch.float64).reshape(2, 1, 4) + 1  # [source, token, d] (m = 2)
    w = torch.zeros(1, 2, 2, 2, dtype=torch.float64)  # [token, frac, source, frac]
    w[0, 0, 0, 0] = w[0, 1, 0, 1] = 3.0  # source 0: 3 x itself
    w[0, 0, 1, 1] = w[0, 1, 1, 0] = 1.0  # source 1: its fractions swapped
    terms = block_terms(w, v)
    torch.testing.assert_close(terms[0, 0], 3 * v[0, 0])
    torch.testing.assert_close(terms[1, 0], torch.tensor([7.0, 8.0, 5.0, 6.0], dtype=torch.float64))
    torch.testing.assert_close(block_mixing(w), torch.tensor([[3.0, 0.0]], dtype=torch.float64))


def test_fractional_mhc_is_refused_in_one_line():
    init, expand, reduce = hyper_connections.mc_get_init_and_expand_reduce_stream_functions(
        2, num_fracs=2, dim=DIM
    )
    net = nn.Sequential(nn.Embedding(VOCAB, DIM), expand, init(branch=FeedForward()), reduce)
    with pytest.raises(DepthscopeError, match=r"reads for HyperConnections only"):
        capture(net, tokens())


def test_the_packages_fraction_matrices_are_drawn_over_units_fraction_major():
    """``fraction_matrix`` puts unit (f, s) at row f * streams + s: a planted 5-d frac_res."""
    import xarray as xr

    from depthscope.figures.causal import fraction_matrix

    v = np.arange(2 * 3 * 2 * 3, dtype=float).reshape(1, 2, 3, 2, 3)  # [layer, f, s, g, t]
    res = xr.DataArray(v, dims=("layer", "frac_from", "stream_from", "frac_to", "stream_to"), name="frac_res")
    m = fraction_matrix(res).isel(layer=0).values
    for f, s, g, t in np.ndindex(2, 3, 2, 3):
        assert m[f * 3 + s, g * 3 + t] == v[0, f, s, g, t]
