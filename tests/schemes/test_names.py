"""The hook vocabulary: the exact ordered list of a 2-block model, built from names.py."""

from __future__ import annotations

from depthscope.schemes import consumers, names, sources
from tests.helpers import build, tiny


def test_ordered_hook_names_of_a_two_block_model():
    model = build(tiny(n_layers=2))
    assert list(model.hook_dict) == [
        "hook_embed",
        "blocks.0.attn_mix.hook_in",
        "blocks.0.attn_mix.hook_weights",
        "blocks.0.hook_attn_out",
        "blocks.0.mlp_mix.hook_in",
        "blocks.0.mlp_mix.hook_weights",
        "blocks.0.hook_mlp_out",
        "blocks.1.attn_mix.hook_in",
        "blocks.1.attn_mix.hook_weights",
        "blocks.1.hook_attn_out",
        "blocks.1.mlp_mix.hook_in",
        "blocks.1.mlp_mix.hook_weights",
        "blocks.1.hook_mlp_out",
        "readout_mix.hook_in",
        "readout_mix.hook_weights",
    ]


def test_names_module_builds_every_hook():
    assert names.source_out(3, "attn") == "blocks.3.hook_attn_out"
    assert names.mix_in(3, "attn", "q") == "blocks.3.attn_mix.q.hook_in"
    assert names.mix_weights(8, names.READOUT) == "readout_mix.hook_weights"
    cfg = tiny("dca")
    hooks = set(build(cfg).hook_dict)
    assert {s.hook for s in sources(cfg)} <= hooks
    assert {c.hook_in for c in consumers(cfg)} | {c.hook_weights for c in consumers(cfg)} <= hooks
    assert [c.label for c in consumers(cfg)][:4] == ["0.attn.q", "0.attn.k", "0.attn.v", "0.mlp"]
