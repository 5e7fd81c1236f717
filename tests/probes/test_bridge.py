"""Foreign models through TransformerBridge: agreement with TransformerLens, refusal of post-LN."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from depthscope.cli import main
from depthscope.errors import TraceError
from depthscope.probes import capture
from tests.helpers import load_bridge

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def gpt2_like():
    from transformer_lens import TransformerBridge, TransformerBridgeConfig

    cfg = TransformerBridgeConfig(
        d_model=32, d_head=8, n_heads=4, n_layers=3, n_ctx=32, d_vocab=256, d_mlp=128, act_fn="gelu", seed=0
    )
    return TransformerBridge.boot_native(cfg)


def model_dir(d, make_model):
    """Save a small word-piece tokenizer (printable ASCII characters, each also as a word's
    continuation ``##c``) and ``make_model(vocab_size)`` as a local HF directory.
    """
    from transformers import BertTokenizerFast

    chars = [chr(c) for c in range(33, 127)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + [f"##{c}" for c in chars]
    # the vocabulary itself, not vocab_file=: transformers 5.24 ignores vocab_file and builds a
    # five-token vocabulary that reads every word as [UNK]
    BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}).save_pretrained(d)
    torch.manual_seed(0)
    make_model(len(vocab)).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def post_ln_dir(tmp_path_factory):
    """A tiny random BERT (post-LN) saved as a local Hugging Face directory with a tokenizer."""
    from transformers import BertConfig, BertForMaskedLM

    return model_dir(
        tmp_path_factory.mktemp("bert"),
        lambda v: BertForMaskedLM(
            BertConfig(
                vocab_size=v,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                max_position_embeddings=64,
            )
        ),
    )


def test_bridge_trace_agrees_with_transformer_lens_decomposition(gpt2_like):
    tokens = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(0))
    trace = capture(gpt2_like, tokens, batch_size=2, skip_positions=0)
    assert list(trace["source"].values[:2]) == ["embed", "pos_embed"]
    assert float(trace["residual_error"].max()) < 1e-5
    _, cache = gpt2_like.run_with_cache(tokens)
    n = gpt2_like.cfg.n_layers
    rows = [(f"{i}.{k}", dict(layer=i, mlp_input=k == "mlp")) for i in range(n) for k in ("attn", "mlp")]
    rows.append(("readout", dict(layer=None)))
    for label, kwargs in rows:
        comps = cache.decompose_resid(incl_embeds=True, **kwargs).double()  # [component, batch, pos, d]
        h = comps.sum(0)
        share = torch.einsum("cbpd,bpd->c", comps, h) / h.pow(2).sum()
        ours = trace["contribution_share"].sel(layer=label).dropna("source").values
        np.testing.assert_allclose(ours, share.numpy(), atol=1e-5, err_msg=label)
        assert np.all(trace["mixing"].sel(layer=label).dropna("source").values == 1.0)


def test_bridge_on_bytes_from_the_default_corpus(gpt2_like):
    trace = capture(gpt2_like, None, n_tokens=128, batch_size=2)
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-5)
    assert trace.attrs["tokens"] == 128 - 4 and trace.attrs["skip_positions"] == 1  # 4 windows of 32


def test_post_ln_model_through_the_bridge_is_refused_with_a_hint(post_ln_dir):
    bert = load_bridge(str(post_ln_dir))
    with pytest.raises(TraceError, match="not additive.*looks post-LN.*depthscope.load"):
        capture(bert, None, n_tokens=128, batch_size=2)


def test_cli_refuses_a_non_additive_model_without_output(post_ln_dir, tmp_path, capsys):
    """The identity check still guards every family: a BERT forced through the plain-sum reading of the
    pre-norm decoder adapter's engine (its hidden states are not sums of sublayer outputs) is refused."""
    from depthscope.probes.adapters import ConsumerSpec, SourceSpec, resolve
    from depthscope.probes.adapters.base import module_attach
    from depthscope.probes.load import load_model

    bert = load_model(post_ln_dir)
    ad = resolve(bert)
    ad.sources = [SourceSpec("embed", "bert.embeddings:out", "embed", 0)] + [
        SourceSpec(f"{i}.{k}", f"bert.encoder.layer.{i}.{m}:out", k, 2 * i + j)
        for i in range(2)
        for j, (k, m) in enumerate((("attn", "attention"), ("mlp", "output")), start=1)
    ]
    ad.consumers = [ConsumerSpec("readout", "bert.encoder.layer.1:out", "readout", 5, 5)]
    ad.attach = module_attach
    with pytest.raises(TraceError, match="not additive"):
        capture(bert, None, n_tokens=128, batch_size=2, adapter=ad)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A tiny random GPT-2 saved as a local Hugging Face directory, with a (word-piece) tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return model_dir(
        tmp_path_factory.mktemp("gpt2"),
        lambda v: GPT2LMHeadModel(GPT2Config(vocab_size=v, n_positions=64, n_embd=32, n_layer=2, n_head=4)),
    )


def test_local_gpt2_directory_from_the_cli(gpt2_dir, tmp_path, capsys):
    from depthscope.trace import load_trace

    out = tmp_path / "g.nc"
    assert (
        main(["capture", str(gpt2_dir), "--out", str(out), "--tokens", "256", "--batch-size", "2", "--quiet"])
        == 0
    )
    trace = load_trace(out)
    assert list(trace["source"].values) == ["embed", "pos_embed", "0.attn", "0.mlp", "1.attn", "1.mlp"]
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-5)
    assert float(trace["residual_error"].max()) < 1e-5
    assert (
        trace.attrs["family"] == "huggingface"
        and trace.attrs["ctx"] == 64
        and trace.attrs["skip_positions"] == 1
    )
    assert trace.attrs["tokens"] == 256 - 4 and "python-stdlib" in trace.attrs["corpus"]
