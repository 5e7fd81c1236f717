"""Properties every scheme variant must have: causality, exact delta basis, hooks, round trip."""

from __future__ import annotations

import pytest
import torch

from depthscope import load
from depthscope.schemes import consumers, sources
from depthscope.schemes.base import variants
from tests.helpers import build, perturb, random_tokens, reconstruct, tiny

VARIANTS = variants()
IDS = [label for label, _, _ in VARIANTS]


@pytest.fixture(params=VARIANTS, ids=IDS)
def variant(request):
    label, scheme, options = request.param
    return tiny(scheme, options)


def test_causal_over_sequence(variant):
    """Changing token t+1 leaves the logits at positions <= t unchanged."""
    model = build(variant)
    tokens = random_tokens(variant)
    t = variant.ctx // 2
    changed = tokens.clone()
    changed[:, t + 1] = (changed[:, t + 1] + 1) % 256
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=0)
    assert (a[:, t + 1] - b[:, t + 1]).abs().max() > 0


def test_delta_basis_rebuilds_every_input(variant):
    """hook_in == sum over written sources of hook_weights * source output (float64)."""
    # move away from initialisation so that learned weights are not trivially uniform
    model = perturb(build(variant, dtype=torch.float64))
    for label, (h, rebuilt) in reconstruct(model, random_tokens(variant)).items():
        err = (h - rebuilt).norm() / h.norm()
        assert err < 1e-10, f"{label}: relative error {err:.2e}"


def test_weights_only_on_written_sources(variant):
    """Each consumer's weights cover exactly the sources written before it."""
    model = build(variant)
    _, cache = model.run_with_cache(random_tokens(variant, pos=8))
    labels = [s.label for s in sources(variant)]
    for c in consumers(variant):
        w = cache[c.hook_weights]
        n = w.shape[3] if w.ndim == 5 else w.shape[2]  # block weights: [batch, pos, frac, source, frac]
        assert (*w.shape[:2], n) == (2, 8, c.site.n_sources), c.label
        assert torch.isfinite(w).all()
        assert labels[: c.site.n_sources][-1] != c.site.label  # never its own output


def test_checkpoint_round_trip(variant, tmp_path):
    model = build(variant)
    model.training_summary = {"steps": 0}
    path = model.save(tmp_path / "m.safetensors")
    loaded = load(path)
    assert not loaded.training and loaded.cfg == variant
    tokens = random_tokens(variant)
    torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)


def test_logits_shape_and_hook_order(variant):
    """The hooks fire in execution order: the embedding first, each consumer's input after every
    source it reads and before the output of its own sublayer, the sources in trace order."""
    model = build(variant)
    fired: list[str] = []
    watched = [s.hook for s in sources(variant)] + [c.hook_in for c in consumers(variant)]
    hooks = [(name, lambda t, hook: fired.append(hook.name)) for name in watched]
    with model.hooks(fwd_hooks=hooks):
        logits = model(random_tokens(variant, pos=5))
    assert logits.shape == (2, 5, 256)
    order = {name: i for i, name in enumerate(fired)}
    assert len(order) == len(fired) == len(watched)  # each hook fired once
    srcs = sources(variant)
    assert fired[0] == "hook_embed" == srcs[0].hook
    assert [order[s.hook] for s in srcs] == sorted(order[s.hook] for s in srcs)
    by_label = {s.label: s.hook for s in srcs}
    for c in consumers(variant):
        assert all(order[s.hook] < order[c.hook_in] for s in srcs[: c.site.n_sources]), c.label
        own = by_label.get(c.label.rsplit(".", 1)[0] if c.label.count(".") > 1 else c.label)
        if own is not None:
            assert order[c.hook_in] < order[own], f"{c.label} read after its sublayer wrote"
