"""The generic Hugging Face decoder reader: one model type per layout kind against the layer-level
oracle (plain hooks on the layers), discovery finding what the layouts table says, static weights
of scaled writes, parallel residuals, a hybrid's ``ssm`` sources in the summaries, and refusals
that name the structural check that failed."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from depthscope.errors import DepthscopeError, TraceError
from depthscope.probes import capture
from depthscope.probes.adapters import claimed, resolve
from depthscope.probes.adapters.huggingface import LAYOUTS, layout_plan, spec_of
from depthscope.probes.adapters.spec import build_spec
from depthscope.probes.adapters.structure import Probe, Refused, Step, discover
from depthscope.probes.load import load_model
from tests.architectures import oracle_errors, running_sum, tiny_model


def check(model, plan, probe):
    """The family's check of a plan: its spec built on the probe, its weights the plan's."""
    return build_spec(model, spec_of(model, plan, probe), find=False, probe=probe)


pytestmark = pytest.mark.golden  # run again under ATEN_CPU_CAPABILITY=default by make test

# one model type per layout kind: (model type, how it is read, its sources' kinds, what it stands for)
AM = {"attn", "mlp"}
KINDS = [
    ("llama", "layout llama", AM, "sequential pre-norm"),
    ("gpt2", "layout gpt2", AM, "learned position embedding as its own source"),
    ("phi", "layout phi", AM, "parallel residual through one shared norm"),
    ("gemma2", "layout gemma2", AM, "a norm on each branch output (sandwich)"),
    ("olmo2", "layout olmo2", AM, "post-norm branches and no input norm"),
    ("gemma", "layout gemma", AM, "an embedding scaled inside its module"),
    ("granite", "layout granite", AM, "scaled writes and embedding"),
    ("mixtral", "layout mixtral", AM, "MoE MLP blocks"),
    ("llama4", "layout llama4_text", AM, "a MoE block that flattens the tokens"),
    ("jamba", "layout jamba", AM | {"ssm"}, "hybrid: mamba or attention, then an MLP"),
    ("qwen3_next", "discovered", AM | {"ssm"}, "discovered: linear attention (ssm), attention, MoE"),
    ("opt", "discovered", AM, "discovered: an MLP of Linear modules on flattened tokens"),
    ("longcat_flash", "discovered", AM, "discovered: a shortcut MoE that reads an earlier stream"),
    ("nanochat", "discovered", AM, "discovered: one norm for the embedding and the read-out"),
    ("inkling_text", "discovered", AM, "discovered: a short convolution on each branch's output"),
]


def tokens(n=2, pos=16, seed=1):
    return torch.randint(5, 100, (n, pos), generator=torch.Generator().manual_seed(seed))


def saved(tmp_path, model_type, **overrides):
    """The tiny model saved and loaded back as a user would (``depthscope.load`` of the directory)."""
    tiny_model(model_type, **overrides).save_pretrained(tmp_path / model_type)
    return load_model(tmp_path / model_type)


@pytest.mark.parametrize("model_type, how, kinds, about", KINDS, ids=[k[0] for k in KINDS])
def test_each_layout_kind_agrees_with_the_layer_level_oracle(tmp_path, model_type, how, kinds, about):
    """Saved, loaded and captured: at every layer boundary the shares of a block's sources sum to
    the share of that layer's write (output minus input, from plain hooks), exactly."""
    model = saved(tmp_path, model_type)
    toks = tokens()
    trace = capture(model, toks, skip_positions=0)
    assert trace.attrs["family"] == "huggingface" and trace.attrs["layout"] == how
    assert set(trace["source_kind"].values) - {"embed"} == kinds
    assert float(trace["residual_error"].max()) < 1e-5
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-6)
    worst = oracle_errors(trace, model, toks)
    assert worst is not None and max(worst.values()) < 1e-6, worst


def test_the_oracle_notices_a_wrong_reading(tmp_path):
    """The oracle can fail: moving share between two blocks of a right trace is caught."""
    model = saved(tmp_path, "llama")
    toks = tokens()
    trace = capture(model, toks, skip_positions=0)
    right = oracle_errors(trace, model, toks)
    assert max(right.values()) < 1e-6
    wrong = trace.copy(deep=True)
    cell = dict(layer="readout", source="0.mlp")
    wrong["contribution_share"].loc[cell] = float(trace["contribution_share"].sel(cell)) + 0.01
    # the planted 0.01 comes back, off by at most the right trace's own float32 disagreement with
    # the oracle (< 1e-6, and CPU-dependent: 2.6e-8 on an AVX2 EPYC), plus float64 rounding
    got = oracle_errors(wrong, model, toks)["write"]
    assert abs(got - 0.01) <= right["write"] + 1e-12, (got, right)


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "phi", "gemma2", "olmo2", "granite", "jamba"])
def test_discovery_finds_what_the_layouts_table_says(model_type):
    """Discovery from the probe's values alone gives the table's plan: the same layers, embedding
    sources and scales, reads, writes, kinds and read-out."""
    model = (
        tiny_model(model_type, residual_multiplier=0.3, embedding_multiplier=5.0)
        if model_type == "granite"
        else tiny_model(model_type)
    )
    probe = Probe(model, model.config.vocab_size)
    table = layout_plan(model, LAYOUTS[model_type], model_type)
    embedding = next(p for p, m in model.named_modules() if m is model.get_input_embeddings())
    found = discover(model, probe, embedding)
    check(model, table, probe)
    check(model, found, probe)
    assert (found.layers, found.readout) == (table.layers, table.readout)
    assert [(e.label, e.tap) for e in found.embeds] == [(e.label, e.tap) for e in table.embeds]
    np.testing.assert_allclose([e.scale for e in found.embeds], [e.scale for e in table.embeds], rtol=1e-6)

    def steps(plan):
        return [
            [({(s.read, s.write, s.kind) for s in st.subs}, st.keep) for st in layer] for layer in plan.steps
        ]

    assert steps(found) == steps(table)
    scales = [
        [s.scale for st in layer for s in sorted(st.subs, key=lambda s: s.write)] for layer in found.steps
    ]
    expect = [
        [s.scale for st in layer for s in sorted(st.subs, key=lambda s: s.write)] for layer in table.steps
    ]
    np.testing.assert_allclose(np.concatenate(scales), np.concatenate(expect), rtol=1e-6)


def test_scaled_writes_and_embeddings_are_static_weights(tmp_path):
    """granite: M = embedding_multiplier on the embedding and residual_multiplier on every write;
    minicpm3: scale_depth / sqrt(L) on every write; gemma scales inside its embedding module, so
    its weights stay 1. Shares stay exact (the oracle) and every row sums to 1."""
    model = saved(tmp_path, "granite", residual_multiplier=0.25, embedding_multiplier=6.0)
    trace = capture(model, tokens(), skip_positions=0)
    m = trace["mixing"]
    assert trace.attrs["static_weights"] == 1 and float(trace["mixing_std"].max()) == 0.0
    np.testing.assert_allclose(m.sel(source="embed").values, 6.0)
    np.testing.assert_allclose(m.drop_sel(source="embed").sel(layer="readout").values, 0.25, rtol=1e-6)
    assert max(oracle_errors(trace, model, tokens()).values()) < 1e-6
    mini = saved(tmp_path, "minicpm3", scale_depth=1.4)
    t = capture(mini, tokens(), skip_positions=0)
    np.testing.assert_allclose(
        t["mixing"].sel(layer="readout").drop_sel(source="embed"), 1.4 / math.sqrt(4), rtol=1e-6
    )
    assert float(t["mixing"].sel(layer="readout", source="embed")) == 1.0
    gemma = capture(saved(tmp_path, "gemma"), tokens(), skip_positions=0)
    assert gemma.attrs["static_weights"] == 0 and float(gemma["mixing"].max()) == 1.0


def test_parallel_residual_has_one_input_per_shared_norm_and_ablation_is_right(tmp_path):
    """phi: attention and MLP read the layer's input through one norm: one consumer row (its
    sources the layer's input's), both writes as sources; ablating the last MLP's write equals
    the loss of the model with that write removed from the final norm's input (plain hooks)."""
    model = saved(tmp_path, "phi")
    toks = tokens()
    trace = capture(model, toks, skip_positions=0, ablate="sources")
    rows = list(trace["layer"].values)
    assert (
        rows == ["0.attn", "1.attn", "2.attn", "3.attn", "readout"] and trace.attrs["parallel_residual"] == 1
    )
    n = trace["mixing"].notnull().sum("source")
    assert [int(n.sel(layer=f"{i}.attn")) for i in range(4)] == [1, 3, 5, 7]
    assert "3.mlp" in trace["source"].values
    mlp = {}
    cut = model.model.layers[3].mlp.register_forward_hook(lambda m, a, out: mlp.__setitem__("v", out))
    drop = model.model.final_layernorm.register_forward_pre_hook(lambda m, a: (a[0] - mlp["v"],))
    try:
        with torch.no_grad():
            ablated = model(toks).logits
    finally:
        cut.remove()
        drop.remove()
    with torch.no_grad():
        clean = model(toks).logits

    def loss(logits):
        return float(
            torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).double(), toks[:, 1:].flatten())
        )

    effect = float(trace["ablation_effect"].sel(source="3.mlp"))
    assert effect == pytest.approx(loss(ablated) - loss(clean), abs=1e-6)


def test_a_hybrids_ssm_sources_are_a_group_of_their_own(tmp_path):
    """jamba: mamba mixers are ``ssm`` sources and consumers; summaries group them like attention
    and MLP (a pure decoder has no such group: NaN). Its weights are unit ones, so the report's scores
    table leaves the pattern out (1 by construction) and says why."""
    from depthscope.analysis import summary
    from depthscope.pipelines.report_data import _model_scores

    trace = capture(saved(tmp_path, "jamba"), tokens(), skip_positions=0)
    kinds = dict(zip(trace["source"].values, trace["source_kind"].values))
    assert [kinds[f"{i}.{k}"] for i, k in [(0, "ssm"), (1, "attn"), (2, "ssm"), (3, "attn")]] == [
        "ssm",
        "attn",
    ] * 2
    s = summary(trace, k=1)
    assert np.isfinite(float(s["pattern_score"].sel(group="ssm")))
    scores = _model_scores(trace, s)  # the report's scores table
    assert np.isnan(scores["pattern_ssm"]) and scores["weights"].startswith("unit")
    plain = capture(saved(tmp_path, "llama"), tokens(), skip_positions=0)
    assert np.isnan(float(summary(plain, k=1)["pattern_score"].sel(group="ssm")))


def _scaled_write(monkeypatch, factor):
    """Patch every Llama layer to add its attention output times ``factor`` (names unchanged)."""
    from transformers.models.llama import modeling_llama

    def forward(self, hidden_states, **kwargs):
        residual = hidden_states
        attn, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        hidden_states = residual + factor(hidden_states) * attn
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))

    monkeypatch.setattr(modeling_llama.LlamaDecoderLayer, "forward", forward)


def test_a_model_whose_forward_differs_from_its_layout_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """Module names of the llama layout, a forward that doubles the attention's write: the layout's
    check on the probe refuses it (one line, exit 2, nothing written), never decomposes it wrongly."""
    from depthscope.cli import main
    from tests.probes.test_bridge import model_dir

    (tmp_path / "m").mkdir()
    model_dir(tmp_path / "m", lambda vocab: tiny_model("llama", vocab_size=vocab))  # with a tokenizer
    _scaled_write(monkeypatch, lambda h: 2.0)
    capsys.readouterr()  # saving's progress bar
    out = tmp_path / "t.nc"
    rc = main(["capture", str(tmp_path / "m"), "--out", str(out), "--tokens", "64", "--ctx", "16", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    # the MLP's norm is where the rebuilt stream first differs from what the model computes
    assert (
        "(the llama layout): consumer 0.mlp (model.layers.0.post_attention_layernorm) does not read the "
        "stream" in err
    )
    assert not out.exists() and not list(tmp_path.glob(".t.nc*"))


def test_a_read_module_that_runs_twice_is_refused_as_the_family_refuses(monkeypatch):
    """A llama whose layers call their MLP norm twice (the same value): the plan's spec is refused
    where it is built (a hook on that norm could not tell the calls apart), in the family's one
    line naming the layout and the module, after trying it as a post-LN model."""
    from transformers.models.llama import modeling_llama

    def forward(self, hidden_states, **kwargs):
        attn, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        hidden_states = hidden_states + attn
        self.post_attention_layernorm(hidden_states)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))

    monkeypatch.setattr(modeling_llama.LlamaDecoderLayer, "forward", forward)
    with pytest.raises(DepthscopeError) as err:
        resolve(tiny_model("llama"))
    msg = str(err.value)
    assert msg.startswith("cannot read this llama model as a sum of its writes (the llama layout): ")
    assert "model.layers.0.post_attention_layernorm runs 2 times" in msg and "nor as a post-LN model" in msg
    assert "\n" not in msg


def test_the_engine_refuses_a_model_that_changes_after_its_probe(monkeypatch):
    """The per-batch rebuild check stays the final guard: an adapter checked on the clean model,
    then a forward that gates each write by its token's stream, is refused on the first batch."""
    model = tiny_model("llama")
    adapter = resolve(model)
    _scaled_write(monkeypatch, lambda h: torch.sigmoid(h.mean(-1, keepdim=True)))
    with pytest.raises(TraceError, match="huggingface model is not additive: its input at"):
        capture(model, tokens(), skip_positions=0, adapter=adapter)


@pytest.mark.parametrize(
    "model_type, check_name",
    [
        # post-LN, with its LayerNorm on the token embedding before the positions are added: neither
        # a sum of its writes nor a post-LN model as find_layout reads them
        ("blenderbot-small", "nor as a post-LN model"),
        ("xlm", "no list of layers found"),  # attention and MLP in separate lists
        ("xmod", "the probe forward failed (ValueError: Input language unknown"),  # needs a language set
    ],
)
def test_a_model_that_is_not_a_sum_of_its_writes_is_refused_naming_the_check(model_type, check_name):
    with pytest.raises(
        DepthscopeError, match=f"cannot read this {model_type} model as a sum of its writes"
    ) as err:
        capture(tiny_model(model_type), tokens(), skip_positions=0)
    assert check_name in str(err.value) and "\n" not in str(err.value)


def test_check_names_a_read_that_does_not_see_the_stream():
    model = tiny_model("llama")
    probe = Probe(model, model.config.vocab_size)
    plan = layout_plan(model, LAYOUTS["llama"], "llama")
    first = plan.steps[0][0].subs[0]
    moved = replace(first, read=first.write.rpartition(":")[0])  # the attention's own (normed) input
    broken = replace(plan, steps=((Step((moved,)), *plan.steps[0][1:]), *plan.steps[1:]))
    with pytest.raises(
        Refused, match=r"consumer 0.attn \(model.layers.0.self_attn\) does not read the stream"
    ):
        check(model, broken, probe)


@pytest.mark.parametrize("where", ["embedding", "write"])
def test_check_refuses_a_plan_whose_static_scale_is_not_the_models(where):
    """granite scales its embedding by 5 and every write by 0.3: the check of the plan (the one every
    reading passes, ``structure.verify``) rebuilds each consumer's input with the plan's static
    weights, so a plan that drops one scale is refused at the first consumer that reads it, and the
    true plan's weights rebuild every input."""
    model = tiny_model("granite", residual_multiplier=0.3, embedding_multiplier=5.0)
    probe = Probe(model, model.config.vocab_size)
    plan = layout_plan(model, LAYOUTS["granite"], "granite")
    consumers = check(model, plan, probe).consumers
    assert consumers[0].static == (5.0,) and consumers[1].static == pytest.approx((5.0, 0.3))
    if where == "embedding":
        broken = replace(plan, embeds=(replace(plan.embeds[0], scale=1.0),))
        first, how = "0.attn", "unweighted"  # the embedding alone, at 1
    else:
        sub = replace(plan.steps[0][0].subs[0], scale=1.0)
        broken = replace(plan, steps=((Step((sub,)), *plan.steps[0][1:]), *plan.steps[1:]))
        first, how = "0.mlp", "with its static weights"  # (5, 1): the embedding's scale kept
    with pytest.raises(
        Refused, match=rf"^ModelSpec: consumer {first} \(.*\) does not read the stream: .* {how}"
    ):
        check(model, broken, probe)


def test_native_families_keep_their_model_types():
    """A family that declares MODEL_TYPES reads them; the generic reader takes the rest."""
    from depthscope.probes.adapters import huggingface

    assert (
        claimed("beam") == "beam" and claimed("deepseek_v4") == "deepseek_v4" and claimed("bert") == "post-ln"
    )
    assert claimed("llama") is None and claimed("mamba") is None
    model = tiny_model("llama")
    assert huggingface.detect(model) and resolve(model).family == "huggingface"
    assert running_sum(capture(model, tokens(), skip_positions=0))
