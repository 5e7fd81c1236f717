"""Inkling-2 (transformers) through the inkling2 adapter: Block Attention Residuals with q/k/v reads.
Each consumer's per-token weights equal least squares of its input on the sources, both recorded by
plain hooks (random and perturbed queries); the q/k/v rows feed ``views`` and the report's
read-depth figure; `depthscope capture DIR` on a saved text and multimodal model, shares against
the same independent computation."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from depthscope.analysis.causal import views
from depthscope.probes import capture
from tests.probes.adapters.lstsq import (
    assert_shares,
    cli_windows,
    compare,
    record,
    rows_of,
    save_byte_tokenizer,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
VOCAB = 256  # a directory without a tokenizer reads text as bytes
TYPES = ["hybrid", "hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"]  # full, sliding, ...
BLOCK = 2  # n_layers_per_attn_res_block: boundaries at layers 0, 2, 4


def text_config():
    from transformers import Inkling2TextConfig

    return Inkling2TextConfig(
        vocab_size=VOCAB,
        unpadded_vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=len(TYPES),
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        swa_num_attention_heads=2,
        swa_num_key_value_heads=1,
        swa_head_dim=16,
        sliding_window_size=8,
        d_rel=4,
        rel_extent=16,
        moe_intermediate_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        n_layers_per_attn_res_block=BLOCK,
        layer_types=TYPES,
        eos_token_id=None,
    )


def multimodal():
    from transformers import Inkling2Config, Inkling2ForConditionalGeneration

    vision = dict(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        patch_size=4,
        posemb_grid_size=4,
        projection_hidden_dim=16,
        text_hidden_size=32,
    )
    cfg = Inkling2Config(text_config=text_config().to_dict(), vision_config=vision, image_token_id=VOCAB - 1)
    return Inkling2ForConditionalGeneration(cfg)


def tokens(n=2, pos=16, seed=1):
    return torch.randint(0, VOCAB, (n, pos), generator=torch.Generator().manual_seed(seed))


def perturb(model, seed=0):
    """Spread every block attention residual's queries (zero at initialisation: uniform softmax)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("query"):
                p.add_(3.0 * torch.randn(p.shape, generator=g))
    return model


def consumers(prefix: str) -> list[tuple[str, str, str]]:
    """(consumer row, its input's norm, source that the consumer reads last)."""
    out = []
    for i, kind in enumerate(TYPES):
        layer = f"{prefix}layers.{i}"
        last = "embed" if i == 0 else f"{i - 1}.mlp"
        if kind == "hybrid":
            out += [(f"{i}.attn.{v}", f"{layer}.{v}_input_layernorm", last) for v in "qkv"]
        else:
            out.append((f"{i}.attn", f"{layer}.input_layernorm", last))
        out.append((f"{i}.mlp", f"{layer}.post_attention_layernorm", f"{i}.attn"))
    return [*out, ("readout", f"{prefix}norm", f"{len(TYPES) - 1}.mlp")]


def independent(model, prefix: str, toks):
    """Per-token least-squares rows of every consumer, from plain hooks only: the sources are what
    the short convolutions hand to the residual."""
    taps = [("embed", f"{prefix}embed_tokens", "out")]
    for i in range(len(TYPES)):
        taps += [
            (f"{i}.attn", f"{prefix}layers.{i}.post_attention_convolution", "out"),
            (f"{i}.mlp", f"{prefix}layers.{i}.post_mlp_convolution", "out"),
        ]
    taps += [(f"{row}.in", path, "in") for row, path, _ in consumers(prefix)]
    seen = {k: v[0] for k, v in record(model, toks, taps).items()}
    order = ["embed"] + [f"{i}.{k}" for i in range(len(TYPES)) for k in ("attn", "mlp")]
    inputs = {row: (f"{row}.in", order.index(last) + 1) for row, _, last in consumers(prefix)}
    rows, resid = rows_of(seen, order, inputs)
    return rows, resid, seen, order, inputs


@pytest.fixture(scope="module")
def model():
    from transformers import Inkling2ForCausalLM

    torch.manual_seed(0)
    return Inkling2ForCausalLM(text_config()).eval()


@pytest.mark.parametrize("perturbed", [False, True], ids=["random", "perturbed"])
def test_mixing_equals_least_squares_on_the_hooked_tensors(model, perturbed):
    if perturbed:
        model = perturb(model)
    toks = tokens()
    trace = capture(model, toks, batch_size=1, skip_positions=0)
    rows, resid, *_ = independent(model, "model.", toks)
    assert resid < 1e-5  # every input is a combination of the hooked sources
    assert float(trace["residual_error"].max()) < 1e-4
    assert compare(trace, rows) < 1e-5
    assert list(trace["layer"].values) == [row for row, _, _ in consumers("")]
    assert trace.attrs["family"] == "inkling2" and trace.attrs["scheme"] == "attnres"
    alpha = trace["attnres_alpha"]
    assert alpha.sizes["entry"] == 4  # embed, block 1, block 2, partial
    np.testing.assert_allclose(alpha.dropna("layer", how="all").sum("entry"), 1.0, rtol=1e-6)
    assert alpha.sel(layer="0.attn.q").isnull().all() and alpha.sel(layer="readout").notnull().sum() == 4
    if not perturbed:
        # zero queries: a uniform softmax over the entries, and the embedding (an entry of its own)
        # weighs its softmax weight over its RMS at every consumer
        mixed = alpha.dropna("layer", how="all")
        n = mixed.notnull().sum("entry")
        np.testing.assert_allclose(mixed.isel(entry=0), 1.0 / n, rtol=1e-6)
        embed = rows_embed(model, toks)
        inv_rms = float((1.0 / torch.sqrt(embed.square().mean(-1) + 1e-6)).mean())
        np.testing.assert_allclose(
            trace["mixing"].sel(layer=mixed["layer"], source="embed"),
            mixed.isel(entry=0) * inv_rms,
            rtol=1e-5,
        )


def rows_embed(model, toks):
    """The embedding as the decoder receives it (a plain hook)."""
    return record(model, toks, [("embed", "model.embed_tokens", "out")])["embed"][0]


def test_query_key_and_value_rows_read_different_depths(model):
    """The three queries of a full-attention layer are separate consumers: `views` finds them, and
    once trained (here: perturbed) they read different depths."""
    trace = capture(perturb(model, seed=5), tokens(), skip_positions=0)
    v = views(trace)
    assert list(v["view"].values) == ["q", "k", "v"] and list(v["block"].values) == [0, 2, 4]
    lag = v["mean_lag"]
    np.testing.assert_allclose(lag.sel(block=0), 1.0)  # layer 0 reads the embedding only
    assert float(abs(lag.sel(block=4, view="q") - lag.sel(block=4, view="v"))) > 0.05
    assert float(abs(lag.sel(block=4, view="k") - lag.sel(block=4, view="v"))) > 0.05


@pytest.mark.parametrize("kind", ["inkling2_text", "inkling2"])
def test_capture_directory_shares_against_least_squares(model, tmp_path, kind):
    """`depthscope capture DIR` of a saved Inkling2ForCausalLM and Inkling2ForConditionalGeneration
    (a byte-level tokenizer saved beside it), the shares recomputed on the same windows."""
    from depthscope.cli import main
    from depthscope.trace import load_trace

    torch.manual_seed(0)
    net = perturb(model if kind == "inkling2_text" else multimodal().eval(), seed=7)
    net.save_pretrained(tmp_path / kind)
    save_byte_tokenizer(tmp_path / kind)
    out = tmp_path / "t.nc"
    assert (
        main(["capture", str(tmp_path / kind), "--out", str(out), "--tokens", "64", "--ctx", "16", "--quiet"])
        == 0
    )
    trace = load_trace(out)
    assert (
        trace.attrs["family"] == "inkling2" and ": inkling2_text" in trace.attrs["label"]
    )  # the decoder's type
    windows = cli_windows(tmp_path / kind, 16, 64)
    prefix = "model." if kind == "inkling2_text" else "model.language_model."
    rows, resid, seen, order, inputs = independent(net, prefix, windows)
    assert resid < 1e-5
    assert_shares(trace, rows, seen, order, inputs, skip=1)


def test_report_draws_the_query_key_value_read_depth(model, tmp_path):
    """`depthscope report DIR` on an Inkling-2 directory: the q/k/v read-depth figure and the Block
    AttnRes native figure are drawn."""
    from depthscope.cli import main

    perturb(model, seed=9).save_pretrained(tmp_path / "ink")
    args = ["report", str(tmp_path / "ink"), "--out", str(tmp_path / "rep"), "--tokens", "64", "--ctx", "16"]
    assert main([*args, "--quiet"]) == 0
    figures = sorted(p.name for p in (tmp_path / "rep").glob("*.png"))
    assert any(f.startswith("read-depth-") for f in figures), figures
    assert any(f.startswith("native-") for f in figures), figures
    assert "read-depth-" in (tmp_path / "rep" / "index.html").read_text()
