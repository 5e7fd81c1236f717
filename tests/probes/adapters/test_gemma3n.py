"""Gemma 3n (transformers) through the gemma3n adapter: AltUp streams and LAuReL. Each consumer's
per-token weights equal least squares of its input on the sources, both recorded by plain hooks
(random and perturbed AltUp weights); LAuReL's 1/sqrt(2) is an exact, constant weight;
`depthscope capture DIR` on a saved model, shares against the same independent computation."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

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
VOCAB, N_LAYERS, STREAMS = 256, 3, 4  # 256: a directory without a tokenizer reads text as bytes


def tiny_config():
    from transformers import Gemma3nTextConfig

    return Gemma3nTextConfig(
        vocab_size=VOCAB,
        vocab_size_per_layer_input=VOCAB,
        hidden_size=32,
        hidden_size_per_layer_input=8,
        intermediate_size=64,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        laurel_rank=4,
        num_kv_shared_layers=1,  # the last layer reads an earlier layer's keys and values
        layer_types=["sliding_attention", "full_attention", "full_attention"],
        activation_sparsity_pattern=[0.0, 0.0, 0.0],  # a sparse MLP can write exactly 0 at a token
        sliding_window=8,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def tokens(n=2, pos=16, seed=1):
    return torch.randint(0, VOCAB, (n, pos), generator=torch.Generator().manual_seed(seed))


def perturb(model, seed=0):
    """Move AltUp's router, prediction and correction coefficients and its output scale (zero at
    initialisation) and LAuReL's norm off their initial values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".altup." in name or "laurel" in name:
                p.add_(0.5 * torch.randn(p.shape, generator=g))
    return model


def independent(model, toks):
    """Per-token least-squares rows of every consumer, from plain hooks only."""
    taps = [("streams", "model.layers.0", "in"), ("readout.in", "model.norm", "in")]
    order = ["embed"] + [f"embed.stream{k}" for k in range(1, STREAMS)]
    inputs = {}
    for i in range(N_LAYERS):
        layer = f"model.layers.{i}"
        inputs[f"{i}.attn"] = (f"{i}.attn.in", len(order))
        order += [f"{i}.laurel", f"{i}.attn"]
        inputs[f"{i}.mlp"] = (f"{i}.mlp.in", len(order))
        order += [f"{i}.mlp", f"{i}.ple"]
        taps += [
            (f"{i}.laurel", f"{layer}.laurel", "out"),
            (f"{i}.attn", f"{layer}.post_attention_layernorm", "out"),
            (f"{i}.mlp", f"{layer}.post_feedforward_layernorm", "out"),
            (f"{i}.ple", f"{layer}.post_per_layer_input_norm", "out"),
            (f"{i}.attn.in", f"{layer}.input_layernorm", "in"),
            (f"{i}.mlp.in", f"{layer}.pre_feedforward_layernorm", "in"),
            (f"{i}.c", f"{layer}.altup.correction_coefs", "out"),
        ]
    for k in range(1, STREAMS):
        taps.append((f"readout.stream{k}", f"model.altup_unembed_projections.{k - 1}", "out"))
        order.append(f"readout.stream{k}")
    inputs["readout"] = ("readout.in", len(order))
    seen = {k: v[0] for k, v in record(model, toks, taps).items()}
    streams = seen.pop("streams")
    seen.update({"embed": streams[0], **{f"embed.stream{k}": streams[k] for k in range(1, STREAMS)}})
    rows, resid = rows_of(seen, order, inputs)
    return rows, resid, seen, order, inputs


@pytest.fixture(scope="module")
def model():
    from transformers import Gemma3nForCausalLM

    torch.manual_seed(0)
    return Gemma3nForCausalLM(tiny_config()).eval()


@pytest.mark.parametrize("perturbed", [False, True], ids=["random", "perturbed"])
def test_mixing_equals_least_squares_on_the_hooked_tensors(model, perturbed):
    if perturbed:
        model = perturb(model)
    toks = tokens()
    trace = capture(model, toks, batch_size=1, skip_positions=0)
    rows, resid, seen, order, _ = independent(model, toks)
    assert resid < 1e-5  # every input is a combination of the hooked sources
    assert float(trace["residual_error"].max()) < 1e-4
    assert compare(trace, rows) < 1e-5
    assert list(trace["source"].values) == order
    assert trace.attrs["family"] == "gemma3n" and trace.attrs["streams"] == STREAMS
    for i in range(N_LAYERS):  # LAuReL's mix: attention and LAuReL each weigh exactly 1/sqrt(2)
        cell = trace["mixing"].sel(layer=f"{i}.mlp", source=[f"{i}.laurel", f"{i}.attn"])
        np.testing.assert_allclose(cell, 1 / math.sqrt(2), rtol=1e-6)
        assert float(trace["mixing_std"].sel(layer=f"{i}.mlp", source=f"{i}.attn")) < 1e-6
        c = seen[f"{i}.c"].flatten(0, 1).mean(0) + 1.0  # the native correction is the module's own + 1
        np.testing.assert_allclose(trace["altup_correction"].sel(layer=f"{i}.mlp"), c, rtol=1e-5)
    if perturbed:  # the router makes the weights of earlier writes vary over tokens
        assert float(trace["mixing_std"].sel(layer="2.attn").max()) > 0.01


def test_capture_directory_shares_against_least_squares(model, tmp_path):
    """`depthscope capture DIR` (a byte-level tokenizer saved beside it), then the shares
    recomputed on the same windows from plain hooks and least squares."""
    from depthscope.cli import main
    from depthscope.trace import load_trace

    perturb(model, seed=3).save_pretrained(tmp_path / "g")
    save_byte_tokenizer(tmp_path / "g")
    # Gemma 3n saves its intermediate sizes as one per layer: the loader's size check takes the list
    assert isinstance(json.loads((tmp_path / "g" / "config.json").read_text())["intermediate_size"], list)
    out = tmp_path / "t.nc"
    assert (
        main(["capture", str(tmp_path / "g"), "--out", str(out), "--tokens", "64", "--ctx", "16", "--quiet"])
        == 0
    )
    trace = load_trace(out)
    assert trace.attrs["family"] == "gemma3n" and "gemma3n_text" in trace.attrs["label"]
    windows = cli_windows(tmp_path / "g", 16, 64)
    rows, resid, seen, order, inputs = independent(model, windows)
    assert resid < 1e-5
    assert_shares(trace, rows, seen, order, inputs, skip=1)
