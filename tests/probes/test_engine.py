"""The one capture engine: checks on every batch for every model kind, sources that never fire,
eval mode and hooks restored, and the rotary (Llama-style) bridge regression."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from depthscope.errors import DepthscopeError, TraceError
from depthscope.probes import capture
from depthscope.probes.adapters import FAMILIES, SourceSpec, resolve
from tests.helpers import build, perturb, random_tokens, tiny
from tests.probes.test_bridge import model_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny random Llama (rotary positions, RMSNorm, GQA) as a local Hugging Face directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return model_dir(
        tmp_path_factory.mktemp("llama"),
        lambda v: LlamaForCausalLM(
            LlamaConfig(
                vocab_size=v,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=128,
            )
        ),
    )


@pytest.fixture(scope="module")
def llama(llama_dir):
    from tests.helpers import load_bridge

    return load_bridge(llama_dir)


@pytest.mark.parametrize("shape", [(9, 64), (5, 128), (4, 32)])
def test_rotary_bridge_has_no_position_source_and_rebuilds_every_batch(llama, shape):
    """Regression: a rotary bridge has a hook_pos_embed that never fires; it must not be a source
    (its buffer slot was uninitialised memory added into every rebuilt input)."""
    tokens = torch.randint(0, 50, shape, generator=torch.Generator().manual_seed(shape[0]))
    trace = capture(llama, tokens, batch_size=4)
    assert list(trace["source"].values[:2]) == ["embed", "0.attn"]
    assert float(trace["residual_error"].max()) < 1e-5
    assert np.isfinite(trace["contribution_share"].values[trace["mixing"].notnull().values]).all()
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-5)
    first = trace["mixing"].sel(layer="0.attn").dropna("source")
    assert list(first["source"].values) == ["embed"]  # the first consumer reads the embedding alone: 1/T = 1


def test_rotary_bridge_agrees_with_hidden_states(llama, llama_dir):
    """Shares from the trace against shares computed from Hugging Face's own hidden states."""
    from transformers import AutoModelForCausalLM

    tokens = torch.randint(0, 50, (3, 40), generator=torch.Generator().manual_seed(3))
    trace = capture(llama, tokens, batch_size=2, skip_positions=0)
    hf = AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    with torch.no_grad():
        hs = hf(
            tokens, output_hidden_states=True
        ).hidden_states  # embed, after block 0, after block 1 (normed)
    # the input of block 1's attention is hidden_states[1]; its parts: embed and block 0's two outputs
    h = hs[1].double()
    share = trace["contribution_share"].sel(layer="1.attn").dropna("source")
    rebuilt_norm = float((h * h).sum())
    emb = hs[0].double()
    np.testing.assert_allclose(
        float(share.sel(source="embed")), float((emb * h).sum()) / rebuilt_norm, rtol=1e-4
    )


def _with_ghost(position: int):
    """A tiny model and its adapter with one extra source whose hook point exists but never fires."""
    from dataclasses import replace

    from transformer_lens.hook_points import HookPoint

    model = build(tiny())
    model.blocks[2].hook_never = HookPoint()  # registered, never called
    model.setup()
    ad = resolve(model)
    ad.sources.insert(position, SourceSpec("ghost", "blocks.2.hook_never", "attn", 99))
    ad.consumers = [replace(c, n_sources=c.n_sources + (position < c.n_sources)) for c in ad.consumers]
    return model, ad


def test_a_source_that_never_fires_is_refused():
    """Never uninitialised memory: a source whose tap does not fire in a batch is an error."""
    model, ad = _with_ghost(len(resolve(build(tiny())).sources))  # after every source: nobody reads it
    with pytest.raises(TraceError, match=r"source ghost \(blocks\.2\.hook_never\) did not fire in batch 0"):
        capture(model, random_tokens(tiny()), adapter=ad)
    model, ad = _with_ghost(1)  # read by every consumer but the first
    with pytest.raises(TraceError, match="consumer 0.mlp reads source ghost, which has not fired before it"):
        capture(model, random_tokens(tiny()), adapter=ad)
    assert all(not h._forward_hooks for h in model.hook_dict.values())


def test_identity_is_checked_on_every_batch():
    """A model whose input stops being the sum of its sources in the third batch is refused there."""
    model = build(tiny())
    calls = {"n": 0}

    def corrupt(t, hook):
        calls["n"] += t.shape[0] == 2  # batches of 2 windows (not the adapter's 1 x 2 read of static weights)
        return t * 1.5 if calls["n"] > 2 else t  # hook_in of 1.mlp, from the third batch on

    tokens = random_tokens(tiny(), batch=8)
    with model.hooks(fwd_hooks=[("blocks.1.mlp_mix.hook_in", corrupt)]):
        with pytest.raises(TraceError, match=r"not additive: its input at 1\.mlp .* in batch 2"):
            capture(model, tokens, batch_size=2)


def test_eval_mode_and_hooks_restored_for_every_family(llama):
    for model in (build(tiny("attnres")), llama):
        model.train()
        capture(model, torch.randint(0, 50, (2, 16)), batch_size=2)
        assert model.training
        assert all(not h._forward_hooks for h in model.hook_dict.values())
        with pytest.raises(DepthscopeError):
            capture(model, torch.arange(3))
        assert model.training and all(not h._forward_hooks for h in model.hook_dict.values())


def test_unknown_model_names_the_known_families():
    with pytest.raises(DepthscopeError, match="no adapter knows it .*" + ", ".join(FAMILIES)):
        capture(torch.nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(DepthscopeError, match="unknown adapter 'nope'"):
        capture(build(tiny()), random_tokens(tiny()), adapter="nope")


def test_the_accumulator_is_what_a_fold_reads():
    """A fold names every member of the batch it uses (``folds.Batch``); the accumulator has each,
    methods with the protocol's parameters."""
    import inspect
    import re

    from depthscope.probes.accumulate import Accumulator
    from depthscope.probes.folds import Batch

    members = {n for n in dir(Batch) if not n.startswith("_")} | set(Batch.__annotations__)
    assert {"V", "norms", "dtype", "n_of", "total", "add_rows", "fold_error", "moments"} <= members
    for name in members:
        mine = getattr(Batch, name, None)
        if callable(mine):
            theirs = getattr(Accumulator, name)
            assert list(inspect.signature(theirs).parameters) == list(inspect.signature(mine).parameters), (
                name
            )
        else:
            assert re.search(rf"self\.{name}\b[^=\n]*= ", inspect.getsource(Accumulator)), name  # it sets it


@pytest.mark.parametrize(
    "scheme, options",
    [
        ("attnres", {}),
        ("dca", {}),
        ("dca", {"grn": "v1"}),
        ("dca", {"grn": "v3"}),
        ("frac", {}),
        ("post-ln", {}),
        ("qwen4_exp", {}),
    ],
)
def test_the_folds_give_one_trace_in_any_token_chunks(monkeypatch, scheme, options):
    """Per-token, split per-feature (DCA's, with a shared base; GRN-v3's), static (GRN-v1), block,
    post-LN carried weights (a random BERT's) and factored per-feature ones (a random qwen4_exp's
    gated streams), with a position cut, folded in chunks of a few
    tokens (512 bytes: one token when a token's terms are larger), their moments merged a consumer at
    a time, and in one chunk per batch (an accelerator's, ``folds.chunk_bytes``), every consumer's
    moments at once, give the same trace, to the float32 rounding of the products (summed in float64
    either way)."""
    from depthscope.probes import accumulate
    from tests.families import BY_FAMILY, sizes

    if scheme in BY_FAMILY:
        model = BY_FAMILY[scheme](sizes(vocab=256))[0].eval()
    else:
        model = perturb(build(tiny(scheme, options)))  # weights away from their init: not uniform
    tokens = random_tokens(tiny(), batch=4)
    traces = []
    for size in (512, 1 << 40):  # the weight moments merged one consumer at a time, then all at once
        monkeypatch.setattr(accumulate, "chunk_bytes", lambda device, size=size: size)
        traces.append(capture(model, tokens, batch_size=2, skip_positions=1))
    small, whole = traces
    for t in traces:  # NaN fails
        assert float(t["residual_error"].max()) <= 1e-5
    for name in ("mixing", "mixing_abs", "mixing_std", "contribution_share", "norm_share"):
        a, b = small[name].values, whole[name].values
        cells = ~np.isnan(b)
        assert np.array_equal(np.isnan(a), ~cells) and cells.any(), name
        err = np.abs(a - b)[cells].max() / (np.abs(b)[cells].max() or 1.0)  # a static model: std 0
        assert err <= 1e-5, (name, err)
