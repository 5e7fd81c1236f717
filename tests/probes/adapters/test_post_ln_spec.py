"""Post-LN models through a ModelSpec (``norms=``): a transformers encoder read through the spec its
family prints equals the family's own trace; research code with post-norm blocks, written as such
code is, equals the independent decomposition (plain Embedding and LayerNorm hooks, terms carried by
hand); a spec that names what does not normalise or read the stream is refused in one line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from depthscope.cli import main
from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.adapters import post_ln
from depthscope.probes.adapters.huggingface import plan_spec
from depthscope.probes.adapters.spec import ModelSpec, build_spec
from depthscope.probes.adapters.suggest import suggest_spec
from depthscope.trace import load_trace
from tests.architectures import tiny_model
from tests.probes.adapters.spec_models import NanoGPT
from tests.probes.adapters.test_post_ln import MODELS, config, independent_decomposition, saved, tokens

__all__ = ["saved"]  # the saved encoders' fixture

VARS = ("contribution_share", "mixing", "norm_share", "input_rms", "source_rms", "residual_error")


def same_traces(a, b):
    assert list(a["source"].values) == list(b["source"].values)
    assert list(a["layer"].values) == list(b["layer"].values)
    for var in VARS:
        np.testing.assert_allclose(b[var].values, a[var].values, rtol=1e-12, atol=1e-14, err_msg=var)


@pytest.mark.parametrize("kind", ["bert", "roberta", "electra-projected", "distilbert"])
def test_the_printed_spec_of_a_post_ln_encoder_reads_it_as_its_family_does(kind):
    torch.manual_seed(0)
    model = MODELS[kind](config(kind, 99)).eval().double()
    printed = suggest_spec(model)
    assert printed.spec == post_ln.spec_of(model) and "norms={" in printed.python()
    assert printed.notes[-1].startswith("checked on a probe forward: read")
    by_family = capture(model, tokens(), batch_size=2, skip_positions=0)
    by_spec = capture(model, tokens(), batch_size=2, skip_positions=0, spec=printed.spec)
    assert by_spec.attrs["layout"] == "post-ln spec" and by_spec.attrs["ctx"] == by_family.attrs["ctx"]
    same_traces(by_family, by_spec)


def test_depthscope_spec_writes_a_file_that_captures_a_saved_encoder_as_its_family_does(saved, tmp_path):
    """RoBERTa: the file names its norms and its context (two short of its position table)."""
    printed = tmp_path / "spec.py"
    assert main(["spec", str(saved("roberta")), "--out", str(printed)]) == 0
    text = printed.read_text()
    assert (
        "norms={" in text and '"ln2": "roberta.encoder.layer.*.output.LayerNorm"' in text and "ctx=38" in text
    )
    argv = ["capture", str(saved("roberta")), "--tokens", "128", "--ctx", "32", "--quiet", "--out"]
    assert main([*argv, str(tmp_path / "a.nc")]) == 0
    assert main([*argv, str(tmp_path / "b.nc"), "--spec", str(printed)]) == 0
    same_traces(load_trace(tmp_path / "a.nc"), load_trace(tmp_path / "b.nc"))


@pytest.mark.parametrize("model_type", ["bart", "openai-gpt"])
def test_a_post_ln_model_found_by_structure_is_read_through_the_spec_plan_spec_gives(model_type):
    torch.manual_seed(0)
    model = tiny_model(model_type).eval().double()
    spec, how = plan_spec(model)
    assert how == "post-LN structure" and spec.norms
    by_family = capture(model, tokens(2, 16), batch_size=2, skip_positions=0)
    by_spec = capture(model, tokens(2, 16), batch_size=2, skip_positions=0, spec=spec)
    assert by_family.attrs["layout"] == "post-ln structure"
    same_traces(by_family, by_spec)


class Mix(nn.Module):
    """A write that mixes earlier positions (a stand-in for attention)."""

    def __init__(self, d: int, positions: int = 1):
        super().__init__()
        self.proj, self.positions = nn.Linear(d, d), positions

    def forward(self, x):
        return torch.tanh(self.proj(x)).cumsum(self.positions) / 4


class PostBlock(nn.Module):
    """The original transformer's block as research code writes it: LN(x + f(x)), then LN(. + g(.))."""

    def __init__(self, d: int, positions: int = 1):
        super().__init__()
        self.mix, self.norm1 = Mix(d, positions), nn.LayerNorm(d)
        self.ff, self.norm2 = (
            nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)),
            nn.LayerNorm(d),
        )

    def forward(self, x):
        x = self.norm1(x + self.mix(x))
        return self.norm2(x + self.ff(x))


class PostLN(nn.Module):
    def __init__(self, vocab: int = 99, d: int = 16, ctx: int = 24, n: int = 3, time_first: bool = False):
        super().__init__()
        self.tok, self.pos, self.norm0 = nn.Embedding(vocab, d), nn.Embedding(ctx, d), nn.LayerNorm(d)
        self.layers = nn.ModuleList(PostBlock(d, 0 if time_first else 1) for _ in range(n))
        self.out = nn.Linear(d, vocab)
        self.time_first = time_first  # fairseq's layout: the layers see [pos, batch, d]

    def forward(self, ids):
        x = self.norm0(self.tok(ids) + self.pos(torch.arange(ids.shape[1])[None]))  # pos: [1, T, d]
        x = x.transpose(0, 1) if self.time_first else x
        for layer in self.layers:
            x = layer(x)
        return self.out(x.transpose(0, 1) if self.time_first else x)


SPEC = ModelSpec(
    embed=["tok", "pos"],
    writes={"attn": "layers.*.mix", "mlp": "layers.*.ff"},
    norms={"embed.ln": "norm0", "ln1": "layers.*.norm1", "ln2": "layers.*.norm2"},
    reads={"attn": "layers.*:in", "mlp": "layers.*.ff:in", "readout": "out:in"},
)


def research_model():
    torch.manual_seed(0)
    return PostLN().double().eval()


def test_research_code_with_post_norm_blocks_equals_the_independent_decomposition():
    model, toks = research_model(), tokens(2, 16)
    trace = capture(model, toks, batch_size=2, skip_positions=0, spec=SPEC)
    assert trace.attrs["family"] == "post-ln" and float(trace["residual_error"].max()) < 1e-12
    assert list(trace["source"].values[:4]) == ["embed", "embed.pos", "embed.ln", "0.attn"]
    rows = independent_decomposition(model, toks, base=model)
    assert len(rows) == trace.sizes["layer"] == 7
    for label, (share, mixing) in zip(trace["layer"].values, rows, strict=True):
        row = trace.sel(layer=label)
        np.testing.assert_allclose(
            row["contribution_share"].dropna("source"), share, atol=1e-10, err_msg=label
        )
        np.testing.assert_allclose(row["mixing"].dropna("source"), mixing, rtol=1e-10, err_msg=label)


def test_a_time_first_post_ln_model_reads_as_its_batch_first_twin():
    """fairseq's layout ([pos, batch, d] inside the layers), the same weights: the same trace."""
    model, toks = research_model(), tokens(2, 16)
    twin = PostLN(time_first=True).double().eval()
    twin.load_state_dict(model.state_dict())
    spec = dataclasses.replace(SPEC, reads={**SPEC.reads, "readout": "layers.2:out"})
    same_traces(
        capture(model, toks, batch_size=2, skip_positions=0, spec=spec),
        capture(twin, toks, batch_size=2, skip_positions=0, spec=spec),
    )


class Doubled(nn.LayerNorm):
    """Named and built like a LayerNorm, but twice one."""

    def forward(self, x):
        return 2 * super().forward(x)


def _broken(what: str):
    model = research_model()
    block = model.layers[0]
    if what == "rms":
        block.norm1 = nn.RMSNorm(16).double()
    elif what == "doubled":
        block.norm2 = Doubled(16).double()
    elif what == "nan":
        with torch.no_grad():
            block.norm1.weight[3] = float("nan")
    return model


@pytest.mark.parametrize(
    "what, change, message",
    [
        ("rms", {}, r"norm 0\.ln1 \(layers\.0\.norm1\) is a RMSNorm: not a LayerNorm"),
        ("doubled", {}, r"norm 0\.ln2 \(layers\.0\.norm2\) does not compute what a LayerNorm"),
        ("nan", {}, r"norm 0\.ln1 \(layers\.0\.norm1\) does not compute|does not read the stream"),
        (
            "",
            {"writes": {"attn": "layers.*.mix", "mlp": "layers.*.ff.0"}},
            r"layers\.0\.ff\.0 writes a width of 32, the stream's is 16",
        ),
        ("", {"reads": {"attn": "layers.*.mix.proj:out"}}, r"consumer 0\.attn .* does not read the stream"),
        ("", {"embed": ["pos", "tok"]}, r"embeddings must run in the order named"),
        ("", {"static": {"0.mlp": [1.0, 1.0]}}, r"static= only to embed\.ln .* not to 0\.mlp"),
        ("", {"static": {"embed.ln": [1.0]}}, r"one scale per embedding"),
        ("", {"reads": {"attn": ["layers.*:in", "layers.*.mix:in"]}}, r"two reads are both 0\.attn"),
        ("", {"norms": {**SPEC.norms, "head": "out"}}, r"the linear map out comes after a write or read"),
        ("", {"head": ("norm0", "out")}, r"weights= and head= do not apply"),
        (
            "",
            {"norms": {"embed.ln": "norm0", "ln1": "layers.*.norm1", "attn": "layers.*.norm2"}},
            r"both 0\.attn",
        ),
    ],
)
def test_a_post_ln_spec_that_does_not_describe_the_model_is_refused_in_one_line(what, change, message):
    model = _broken(what)
    spec = dataclasses.replace(SPEC, **change)
    with pytest.raises(DepthscopeError, match=message) as err:
        build_spec(model, spec)
    assert "\n" not in str(err.value) and str(err.value).startswith("ModelSpec: ")


def test_norms_named_on_a_pre_ln_model_are_refused_where_the_stream_departs():
    """nanoGPT normalises a copy of the stream: its ln_2 reads x + attn, not ln_1(x) + attn."""
    spec = ModelSpec(
        embed=["wte", "wpe"],
        writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
        norms={"ln1": "blocks.*.ln_1", "ln2": "blocks.*.ln_2"},
        reads={"attn": "blocks.*:in", "readout": "ln_f"},
    )
    torch.manual_seed(0)
    with pytest.raises(DepthscopeError, match=r"norm 0\.ln2 \(blocks\.0\.ln_2\) does not read the stream"):
        build_spec(NanoGPT().double().eval(), spec)


def test_a_read_inside_a_chunked_feed_forward_is_refused_in_one_line():
    """On the probe (one chunk) the MLP's first linear map reads the stream; in a capture it sees a chunk."""
    torch.manual_seed(0)
    model = MODELS["bert"](config("bert", 99, chunk_size_feed_forward=8)).double().eval()
    spec = post_ln.spec_of(model)
    inside = dataclasses.replace(spec, reads={**spec.reads, "mlp": "bert.encoder.layer.*.intermediate.dense"})
    build_spec(model, inside)  # the probe runs one chunk: every check holds there
    with pytest.raises(
        DepthscopeError, match="consumer 0.mlp is read inside a feed-forward that runs in chunks"
    ):
        capture(model, tokens(2, 24), spec=inside)


def test_a_post_ln_module_no_family_knows_is_found_and_read_without_a_spec():
    """The research model with no spec: post-LN discovery finds the spec written by hand above (its
    mix write found as the whole mixing module, the MLP read at the first norm's output), and the
    capture without one is the capture with it."""
    model, toks = research_model(), tokens(2, 16)
    suggestion = suggest_spec(model)
    assert suggestion.notes[0].startswith("found post-LN") and suggestion.notes[-1].startswith(
        "checked on a probe forward: read, 15 sources, 7 consumers"
    )
    found = suggestion.spec
    assert (found.embed, found.norms) == ({"embed": "tok", "pos": "pos"}, SPEC.norms)
    assert found.writes == {"attn": "layers.*.mix", "mlp": "layers.*.ff"}
    plain = capture(model, toks, batch_size=2, skip_positions=0)
    assert plain.attrs["spec_origin"] == "discovered" and plain.attrs["family"] == "post-ln"
    by_hand = capture(model, toks, batch_size=2, skip_positions=0, spec=SPEC)
    assert list(plain["source"].values) == ["embed", "pos", *by_hand["source"].values[2:]]
    for var in VARS:
        np.testing.assert_allclose(
            plain[var].values, by_hand[var].values, rtol=1e-12, atol=1e-14, err_msg=var
        )
