"""Does the weight matter: direct logit attribution adds up (and agrees with TransformerLens), the
logit lens, and source ablation against independent interventions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from depthscope.cli import main
from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.adapters import resolve
from depthscope.probes.causal import Ablation
from depthscope.schemes import consumers, sources
from depthscope.schemes.base import variants
from depthscope.trace import load_trace
from tests.helpers import build, perturb, random_tokens, tiny

VARIANTS = variants()


def model_of(scheme, options=None, seed=1):
    return perturb(build(tiny(scheme, options)), 0.3, seed, others=0.05)


@pytest.fixture(scope="module")
def tokens():
    return random_tokens(tiny(), batch=4, seed=3)


@pytest.mark.parametrize("label, scheme, options", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_attribution_adds_up_to_the_logits(tokens, label, scheme, options):
    model = model_of(scheme, options)
    trace = capture(model, tokens, batch_size=2, logits=True)
    assert float(trace["logit_error"].max()) < 1e-5
    with torch.no_grad():
        logits = model(tokens)[:, :-1].double()
    nxt = tokens[:, 1:]
    top1 = logits.argmax(-1)
    wrong = logits.masked_fill(F.one_hot(nxt, 256).bool(), -torch.inf).argmax(-1)
    expect = {
        "correct": logits.gather(-1, nxt[..., None]).mean(),
        "top1": logits.gather(-1, top1[..., None]).mean(),
        "margin": (logits.gather(-1, nxt[..., None]) - logits.gather(-1, wrong[..., None])).mean(),
    }
    total = trace["logit_attribution"].sum("source") + trace["logit_bias"]
    for target, value in expect.items():
        assert float(total.sel(target=target)) == pytest.approx(float(value), rel=1e-5, abs=1e-6), target
    assert trace.attrs["loss"] == pytest.approx(
        float(F.cross_entropy(logits.flatten(0, 1), nxt.flatten())), rel=1e-6
    )


def test_attribution_agrees_with_transformer_lens_logit_attrs():
    """TransformerLens's logit_attrs (compatibility mode: norm gains folded into W_U) on a standard
    bridge, per source and target token, averaged over the same tokens: the same numbers."""
    from transformer_lens import TransformerBridge, TransformerBridgeConfig

    cfg = TransformerBridgeConfig(
        d_model=32,
        d_head=8,
        n_heads=4,
        n_layers=2,
        n_ctx=32,
        d_vocab=256,
        d_mlp=128,
        act_fn="gelu",
        seed=0,
        normalization_type="LN",
    )
    bridge = TransformerBridge.boot_native(cfg)
    bridge.enable_compatibility_mode()
    toks = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(0))
    trace = capture(bridge, toks, batch_size=3, skip_positions=0, logits=True)
    _, cache = bridge.run_with_cache(toks)
    stack = cache.decompose_resid(incl_embeds=True)[:, :, :-1]  # [component, batch, pos, d_model]
    with torch.no_grad():
        theirs = cache.logit_attrs(stack, tokens=toks[:, 1:], pos_slice=slice(0, -1)).mean((1, 2))
    ours = trace["logit_attribution"].sel(target="correct").values
    np.testing.assert_allclose(ours, theirs.detach().double().numpy(), atol=1e-4, rtol=1e-4)


def test_logit_lens_against_the_head_applied_by_hand(tokens):
    model = model_of("attnres")
    trace = capture(model, tokens, batch_size=4, lens=True)
    _, cache = model.run_with_cache(tokens)
    nxt = tokens[:, 1:]
    final = model(tokens)[:, :-1].argmax(-1)
    for c in consumers(model.cfg):
        with torch.no_grad():
            logits = model.unembed(model.ln_final(cache[c.hook_in]))[:, :-1].double()
        ce = F.cross_entropy(logits.flatten(0, 1), nxt.flatten())
        assert float(trace["lens_loss"].sel(layer=c.label)) == pytest.approx(float(ce), rel=1e-6)
        agree = (logits.argmax(-1) == final).double().mean()
        assert float(trace["lens_agreement"].sel(layer=c.label)) == pytest.approx(float(agree))
    assert float(trace["lens_agreement"].sel(layer="readout")) == 1.0
    assert float(trace["lens_loss"].sel(layer="readout")) == pytest.approx(trace.attrs["loss"], rel=1e-9)


@pytest.mark.parametrize("mean", [False, True])
def test_removing_a_source_everywhere_equals_zeroing_its_output(tokens, mean):
    """Standard residual: subtracting a sublayer's output (or its deviation from its token mean) at
    every later consumer is the forward with that output zeroed (replaced by its mean)."""
    model = model_of("standard")
    trace = capture(model, tokens, batch_size=4, ablate="sources", ablate_mean=mean)
    nxt = tokens[:, 1:]

    def loss(fn=None, hook=None):
        hooks = [(hook, lambda t, hook: fn(t))] if hook else []
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            logits = model(tokens)[:, :-1].double()
        return float(F.cross_entropy(logits.flatten(0, 1), nxt.flatten()))

    clean = loss()
    for s in sources(model.cfg)[1:]:
        replace = (lambda t: t.mean((0, 1), keepdim=True).expand_as(t)) if mean else torch.zeros_like
        expect = loss(replace, s.hook) - clean
        assert float(trace["ablation_effect"].sel(source=s.label)) == pytest.approx(expect, abs=1e-6), s.label


@pytest.mark.parametrize(
    "scheme, options", [("denseformer", {}), ("attnres", {}), ("attnres", {"blocks": 2}), ("frac", {})]
)
def test_removing_a_source_from_one_consumer_changes_only_that_input_by_its_term(tokens, scheme, options):
    model = model_of(scheme, options)
    cfg = model.cfg
    cons, srcs = consumers(cfg), sources(cfg)
    i = len(cons) - 3  # a late consumer
    j = 2  # a source it reads
    _, clean = model.run_with_cache(tokens)
    w, v = clean[cons[i].hook_weights], clean[srcs[j].hook]
    if w.ndim == 5:  # Frac-Connections' blocks: fraction f of the term is sum_g w[f, j, g] v[g]
        m, fr = w.shape[-1], v.unflatten(-1, (w.shape[-1], -1))
        term = torch.cat([sum(w[..., f, j, g, None] * fr[..., g, :] for g in range(m)) for f in range(m)], -1)
    else:
        term = w[..., j, None] * v
    ablation = Ablation(resolve(model), 0, "cells")
    seen = {}
    with torch.no_grad(), ablation.attach(model, [(j, i)], tokens.shape[0]):
        record = [(c.hook_in, lambda t, hook, c=c: seen.__setitem__(c.label, t.clone())) for c in cons]
        with model.hooks(fwd_hooks=record):  # registered after the ablation: sees the replaced input
            model(tokens)
    for k, c in enumerate(cons[: i + 1]):
        expect = clean[c.hook_in] - (term if k == i else 0)
        torch.testing.assert_close(seen[c.label], expect, rtol=1e-5, atol=1e-6)


def test_cell_effects_sum_and_match_single_runs(tokens):
    model = model_of("denseformer")
    cells = capture(model, tokens, batch_size=4, ablate="cells")["ablation_effect_cell"]
    avail = capture(model, tokens, batch_size=4)["mixing"].notnull()
    assert bool((cells.notnull() == avail).all())
    # the one-consumer effect of the read-out's last source, by hand
    nxt = tokens[:, 1:]
    _, clean = model.run_with_cache(tokens)
    last = sources(model.cfg)[-1]
    delta = clean["readout_mix.hook_weights"][..., -1, None] * clean[last.hook]
    with torch.no_grad(), model.hooks(fwd_hooks=[("readout_mix.hook_in", lambda t, hook: t - delta)]):
        logits = model(tokens)[:, :-1].double()
    with torch.no_grad():
        base = F.cross_entropy(model(tokens)[:, :-1].double().flatten(0, 1), nxt.flatten())
    expect = float(F.cross_entropy(logits.flatten(0, 1), nxt.flatten()) - base)
    assert float(cells.sel(layer="readout", source=last.label)) == pytest.approx(expect, abs=1e-6)


def test_ablating_the_first_windows_only(tokens):
    """``ablate_tokens``: the ablations cover the first windows (by their index in the capture, so
    across batch boundaries), equal an ablation capture of those windows alone, and the rest of
    the trace still covers every token."""
    model = model_of("attnres")
    part = capture(model, tokens, batch_size=3, ablate="cells", ablate_tokens=40)  # 2 windows of 32
    alone = capture(model, tokens[:2], batch_size=2, ablate="cells")
    assert part.attrs["ablation_tokens"] == alone.attrs["ablation_tokens"] == 2 * 31
    np.testing.assert_allclose(
        part["ablation_effect_cell"], alone["ablation_effect_cell"], rtol=1e-9, atol=1e-9
    )
    assert part.attrs["tokens"] == tokens.numel() and part.attrs["logit_tokens"] == 4 * 31
    whole = capture(model, tokens, batch_size=3, ablate="cells", ablate_tokens=10**6)
    every = capture(model, tokens, batch_size=3, ablate="cells")
    np.testing.assert_allclose(whole["ablation_effect_cell"], every["ablation_effect_cell"], rtol=1e-12)


def test_cli_logits_and_ablation(tmp_path, capsys):
    ckpt = tmp_path / "m.safetensors"
    small = [
        "--layers",
        "2",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--ctx",
        "32",
        "--batch-size",
        "4",
        "--quiet",
    ]
    assert main(["train", "--scheme", "dca", "--steps", "3", "--out", str(ckpt), *small]) == 0
    out = tmp_path / "t.nc"
    args = [
        "capture",
        str(ckpt),
        "--out",
        str(out),
        "--tokens",
        "128",
        "--logits",
        "--lens",
        "--ablate",
        "sources",
        "--quiet",
    ]
    assert main(args) == 0
    trace = load_trace(out)
    assert {"logit_attribution", "lens_loss", "ablation_effect"} <= set(trace.data_vars)
    assert trace.attrs["ablation"] == "sources" and float(trace["logit_error"].max()) < 1e-5
    assert main(["capture", str(ckpt), "--out", str(out), "--ablate", "everything", "--quiet"]) == 2
    assert "'everything' is not one of 'sources', 'cells'" in capsys.readouterr().err


def test_ablation_needs_an_lm_head(tmp_path, capsys):
    from transformers import BertConfig, BertModel

    from tests.probes.test_bridge import model_dir

    (tmp_path / "bert").mkdir()
    d = model_dir(
        tmp_path / "bert",
        lambda v: BertModel(
            BertConfig(
                vocab_size=v, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
            )
        ),
    )
    out = tmp_path / "t.nc"
    capsys.readouterr()  # save_pretrained's own progress output
    assert (
        main(["capture", str(d), "--out", str(out), "--ablate", "sources", "--tokens", "128", "--quiet"]) == 2
    )
    err = capsys.readouterr().err
    assert "needs the model's LM head" in err and err.count("\n") == 1 and not out.exists()
    with pytest.raises(DepthscopeError, match="needs the model's LM head"):
        from depthscope.probes.load import load_model

        capture(load_model(d), torch.randint(5, 90, (2, 16)), logits=True)


def test_hugging_face_decoder_attribution_and_ablation(tmp_path):
    """A Llama through module hooks: the attribution adds up, the read-out's lens is the model's loss,
    and removing 0.mlp from every consumer equals zeroing its output (an independent forward hook)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(cfg).eval()
    toks = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    trace = capture(model, toks, logits=True, lens=True, ablate="sources", skip_positions=0)
    assert float(trace["logit_error"].max()) < 1e-5
    assert float(trace["lens_loss"].sel(layer="readout")) == pytest.approx(trace.attrs["loss"], rel=1e-6)

    def loss(zero: bool) -> float:
        handle = (
            model.model.layers[0].mlp.register_forward_hook(lambda m, a, out: torch.zeros_like(out))
            if zero
            else None
        )
        with torch.no_grad():
            logits = model(toks).logits[:, :-1].double()
        if handle:
            handle.remove()
        return float(F.cross_entropy(logits.flatten(0, 1), toks[:, 1:].flatten()))

    expect = loss(True) - loss(False)
    assert float(trace["ablation_effect"].sel(source="0.mlp")) == pytest.approx(expect, abs=1e-5)
