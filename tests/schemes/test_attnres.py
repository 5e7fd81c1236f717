"""Attention Residuals: uniform at initialisation, softmax over depth, block structure, paper forward."""

from __future__ import annotations

import torch

from depthscope.schemes import consumers
from depthscope.schemes._common import rms_norm
from depthscope.schemes.attnres import block_of, entry_of_source
from tests.helpers import build, perturb, random_tokens, tiny


def test_weights_are_exactly_uniform_at_initialisation():
    cfg = tiny("attnres")
    _, cache = build(cfg).run_with_cache(random_tokens(cfg, pos=8))
    for c in consumers(cfg):
        w = cache[c.hook_weights]
        assert torch.equal(w, torch.full_like(w, 1.0 / c.site.n_sources)), c.label


def test_rows_are_softmaxes_over_written_sources():
    cfg = tiny("attnres")
    model = perturb(build(cfg), scale=1.0)
    _, cache = model.run_with_cache(random_tokens(cfg))
    for c in consumers(cfg):
        w = cache[c.hook_weights]
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w[..., 0]))
        assert (w > 0).all() and w.shape[-1] == c.site.n_sources
        if c.site.n_sources > 1:
            assert w.std(dim=(0, 1)).max() > 1e-4  # input-dependent through the keys


def test_full_attnres_matches_the_papers_equations():
    """Independent forward: h_l = sum_i softmax_i(w_l . RMSNorm_l(v_i)) v_i, f_l(Norm(h_l))."""
    cfg = tiny("attnres")
    model = perturb(build(cfg, dtype=torch.float64), scale=1.0)
    tokens = random_tokens(cfg)
    with torch.no_grad():
        values = [model.embed(tokens)]

        def mix(mixer):
            keys = torch.stack([rms_norm(v) * mixer.key_gain for v in values])  # RMSNorm_l with its gain
            alpha = torch.einsum("d,ebpd->bpe", mixer.query, keys).softmax(-1)
            return torch.einsum("bpe,ebpd->bpd", alpha, torch.stack(values))

        for block in model.blocks:
            for kind in ("attn", "mlp"):
                values.append(getattr(block, kind)(mix(getattr(block, f"{kind}_mix"))))
        logits = model.unembed(model.ln_final(mix(model.readout_mix)))
        torch.testing.assert_close(model(tokens), logits, rtol=1e-10, atol=1e-10)


def test_block_structure():
    cfg = tiny("attnres", {"blocks": 4})  # 6 sublayers: S = 1, the last block takes 4..5... (3, 4, 5)
    assert [block_of(cfg, i) for i in range(6)] == [0, 1, 2, 3, 3, 3]
    # the read-out reads the embedding and the 4 block sums; sublayers 3..5 share the last entry
    readout = consumers(cfg)[-1].site
    assert entry_of_source(cfg, readout) == [0, 1, 2, 3, 4, 4, 4]
    model = perturb(build(cfg), scale=1.0)
    _, cache = model.run_with_cache(random_tokens(cfg))
    w = cache["readout_mix.hook_weights"]
    torch.testing.assert_close(w[..., 4], w[..., 5])
    torch.testing.assert_close(w[..., 4], w[..., 6])
    torch.testing.assert_close(w[..., [0, 1, 2, 3, 4]].sum(-1), torch.ones_like(w[..., 0]))
    # inside the last block, the second sublayer sees the partial sum of the first as one entry
    w5 = cache["blocks.2.mlp_mix.hook_weights"]  # sublayer 5: entries embed, b1, b2, b3, partial(3, 4)
    torch.testing.assert_close(w5[..., 4], w5[..., 5])


def test_one_block_per_sublayer_is_full_attnres():
    full, per = tiny("attnres"), tiny("attnres", {"blocks": 6})
    a = build(full)
    b = build(per)
    b.load_state_dict(a.state_dict())
    tokens = random_tokens(full)
    torch.testing.assert_close(a(tokens), b(tokens), rtol=0, atol=0)
