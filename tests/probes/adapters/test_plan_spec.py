"""A transformers model's checked plan written as a ModelSpec (``huggingface.plan_spec``, what
``depthscope spec MODEL`` prints for a model the huggingface family reads): read through the spec,
with its weights found from the activations, it is the family's reading (sources, consumers, their
depths and counts), and the two captures agree on every share and weight. Two computations of the
weights: the family's from the layouts table and config (granite's multipliers), the spec's from
the probe's activations (``fit.choose``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from depthscope.cli import main
from depthscope.probes import capture
from depthscope.probes.adapters import resolve
from depthscope.probes.adapters.huggingface import plan_spec
from depthscope.probes.adapters.spec import build_spec
from tests.architectures import oracle_errors, tiny_model

# (type, overrides, how the family finds its plan): sequential, scaled writes and embedding,
# parallel through one norm, three writes in one step, hybrid layers read by different keys, discovery
CASES = [
    ("llama", {}, "layout llama"),
    ("granite", {"residual_multiplier": 0.3, "embedding_multiplier": 5.0}, "layout granite"),
    ("phi", {}, "layout phi"),
    ("falcon_h1", {}, "layout falcon_h1"),
    ("jamba", {}, "layout jamba"),
    ("arcee", {}, "discovered"),
    ("gpt2", {}, "layout gpt2"),  # a position embedding, labelled pos_embed as the family does
    ("gemma4_text", {}, "discovered"),  # per-layer embeddings: writes and reads under the key ple
    ("xglm", {}, "discovered"),  # the embedding scaled outside modules: the first layer's input (:in)
    ("nanochat", {}, "discovered"),  # the final norm runs twice: the read-out is the last layer's :out
    ("gpt_neox", {}, "layout gpt_neox"),  # a parallel MLP reading fewer sources than before it: static=
    ("mllama", {}, "discovered"),  # a layer that does not run: its modules' names are not a pattern's
]


def rows(ad):
    return (
        [(s.label, s.kind, s.depth) for s in ad.sources],
        [(c.label, c.kind, c.depth, c.n_sources) for c in ad.consumers],
    )


@pytest.mark.parametrize("model_type, overrides, how", CASES, ids=[c[0] for c in CASES])
def test_the_plans_spec_reads_what_the_family_reads(model_type, overrides, how):
    model = tiny_model(model_type, **overrides)
    spec, origin = plan_spec(model)
    assert origin == how and spec is not None
    family, through = resolve(model), build_spec(model, spec)
    assert rows(through) == rows(family)
    for a, b in zip(family.consumers, through.consumers):  # static weights: config against evidence
        want = np.asarray(a.static if a.static is not None else (1.0,) * a.n_sources)
        got = np.asarray(b.static if b.static is not None else (1.0,) * b.n_sources)
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=a.label)
    ids = torch.randint(5, 100, (4, 16), generator=torch.Generator().manual_seed(3))
    kw = {"skip_positions": 0, "progress": False}
    by_family, by_spec = capture(model, ids, **kw), capture(model, ids, spec=spec, **kw)
    for var in ("contribution_share", "mixing", "source_rms"):
        np.testing.assert_allclose(by_spec[var].values, by_family[var].values, rtol=1e-5, atol=1e-7)
    assert float(by_spec["residual_error"].max()) < 1e-5


def test_granites_scales_are_given_as_the_config_says_and_found_by_the_evidence_without():
    """The printed spec gives granite's multipliers (static=, the config's numbers exactly); without
    them its static weights come from the activations, and are granite's."""
    model = tiny_model("granite", residual_multiplier=0.3, embedding_multiplier=5.0)
    spec, _ = plan_spec(model)
    assert spec.static["readout"] == (5.0,) + (0.3,) * 8
    assert build_spec(model, spec).consumers[-1].static == (5.0,) + (0.3,) * 8
    readout = build_spec(model, dataclasses.replace(spec, static={})).consumers[-1]
    np.testing.assert_allclose(readout.static, (5.0,) + (0.3,) * 8, rtol=1e-6)


def test_a_source_written_before_one_it_reads_is_given_weight_zero():
    """longcat_flash's shortcut MoE is computed from the first half-layer's stream and added at the
    layer's end: its write is ordered by when it returns (before the second half's attention), and
    the second half's reads give it weight 0 (static=); the family reads it so, and so does the
    printed spec, and every share is the layer-level oracle's."""
    model = tiny_model("longcat_flash")
    spec, _ = plan_spec(model)
    assert spec.static["0.attn.1"] == (1.0, 1.0, 0.0, 1.0)  # embed, 0.attn, 0.mlp.mlp, 0.mlp
    ids = torch.randint(5, 100, (4, 16), generator=torch.Generator().manual_seed(3))
    kw = {"skip_positions": 0, "progress": False}
    by_family, by_spec = capture(model, ids, **kw), capture(model, ids, spec=spec, **kw)
    assert list(by_spec.source.values[:4]) == ["embed", "0.attn", "0.mlp.mlp", "0.mlp"]
    assert list(by_family.source.values) == list(by_spec.source.values)
    np.testing.assert_allclose(
        by_spec["contribution_share"].values, by_family["contribution_share"].values, atol=1e-7
    )
    worst = oracle_errors(by_family, model, ids)
    assert worst is not None and max(worst.values()) < 1e-6, worst


def test_a_layer_that_scales_the_stream_scales_every_earlier_weight():
    """gemma4 multiplies its layer's output stream by ``layer_scalar``: with 0.5 in every layer, the
    plan scales each source's weight by 0.5 per layer from its own on (the read-out reads the writes
    of layer k = 0..3 with 0.5^(4-k), the embedding with 0.5^4), as the activations say (found
    without static=); the family's capture and the capture through the spec whose weights are found
    agree on every share and weight, and rebuild every input."""
    model = tiny_model("gemma4_text")
    for name, buffer in model.named_buffers():
        if name.endswith("layer_scalar"):
            buffer.fill_(0.5)
    spec, _ = plan_spec(model)
    layer = [0] + [int(s.label.partition(".")[0]) for s in resolve(model).sources[1:]]
    np.testing.assert_allclose(spec.static["readout"], [0.5 ** (4 - k) for k in layer], rtol=1e-6)
    unsaid = dataclasses.replace(spec, static={})
    np.testing.assert_allclose(
        build_spec(model, unsaid).consumers[-1].static, spec.static["readout"], rtol=1e-6
    )
    ids = torch.randint(5, 100, (4, 16), generator=torch.Generator().manual_seed(3))
    kw = {"skip_positions": 0, "progress": False}
    by_family, by_evidence = capture(model, ids, **kw), capture(model, ids, spec=unsaid, **kw)
    for var in ("contribution_share", "mixing"):
        np.testing.assert_allclose(by_evidence[var].values, by_family[var].values, rtol=1e-5, atol=1e-7)
    assert float(by_family["residual_error"].max()) < 1e-5


def test_depthscope_spec_prints_the_plan_of_a_transformers_model(tmp_path, capsys):
    """The printed file names the modules the family reads and, captured with --spec, reads them."""
    tiny_model("llama").save_pretrained(tmp_path / "m")
    capsys.readouterr()
    assert main(["spec", str(tmp_path / "m")]) == 0
    text = capsys.readouterr().out
    assert "the huggingface family reads this model (layout llama)" in text
    assert '"attn": "model.layers.*.self_attn"' in text and '"readout": "model.norm"' in text
    assert "checked on a probe forward: read, 9 sources, 9 consumers (unit weights x 9)" in text
    assert "it reads the same sources and consumers" in text


def test_a_parallel_read_of_fewer_sources_is_given_in_the_printed_file(tmp_path, capsys):
    """gpt_neox's MLP norm runs after the attention has written (a parallel residual) but reads the
    stream before it: the printed spec gives that consumer its sources (static=, unit weights over the
    first ones), so read with it the spec reads what the family reads; without them a spec would count
    the attention's write among the MLP's sources, with weight 0."""
    tiny_model("gpt_neox").save_pretrained(tmp_path / "m")
    capsys.readouterr()
    assert main(["spec", str(tmp_path / "m")]) == 0
    text = capsys.readouterr().out
    assert '"0.mlp": [1.0],' in text and '"1.mlp": [1.0, 1.0, 1.0],' in text
    assert "it reads the same sources and consumers" in text
    model = tiny_model("gpt_neox")
    spec, _ = plan_spec(model)
    without = build_spec(model, dataclasses.replace(spec, static={}))
    assert [c.n_sources for c in without.consumers][:2] == [1, 2]  # 0.attn, 0.mlp (the family: 1, 1)
