"""What a user sees when depthscope cannot read a model: one line that says why and what to do, in
the model's own names, never a traceback (issue 35, items 6 and 10-14)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr

import numpy as np
import pytest
import torch
from torch import nn

from depthscope import DepthscopeError, ModelSpec
from depthscope.probes import capture
from tests.probes.adapters.spec_models import CTX, VOCAB, D, seeded
from tests.test_hostile import assert_one_error_line, run


class Scaled(nn.Module):
    """A branch with a per-channel gain (LayerScale, arXiv 2103.17239): a per-feature weight."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner, self.gamma = inner, nn.Parameter(0.1 + torch.rand(D))

    def forward(self, x):
        return self.gamma * self.inner(x)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm_in, self.attention = nn.LayerNorm(D), nn.Linear(D, D)
        self.norm_mid, self.ffn = (
            nn.LayerNorm(D),
            nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D)),
        )

    def forward(self, x):
        x = x + self.attention(self.norm_in(x)) * self.gain
        return x + self.ffn(self.norm_mid(x)) * self.gain


class OwnNames(nn.Module):
    """A decoder whose modules are named nothing like nanoGPT's, with per-feature gains on its writes."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.tok = nn.Embedding(VOCAB, D)
        self.stack = nn.ModuleList(Layer() for _ in range(2))
        for layer in self.stack:
            layer.gain = nn.Parameter(0.5 + torch.rand(D))
        self.final = nn.LayerNorm(D)

    def forward(self, ids):
        x = self.tok(ids)
        for layer in self.stack:
            x = layer(x)
        return self.final(x)


def test_discovery_refuses_in_the_models_own_names():
    """Item 10: the refusal shows discovery's guess in the model's own names and points to
    `depthscope spec`, never a nanoGPT template (wte, blocks.*.ln_1)."""
    with pytest.raises(DepthscopeError) as err:
        capture(OwnNames().eval(), torch.zeros(2, CTX, dtype=torch.long), progress=False)
    message = str(err.value)
    assert "\n" not in message
    assert "embed=['tok']" in message and "stack.*.attention" in message and "stack.*.norm_in" in message
    assert "wte" not in message and "ln_1" not in message
    assert "depthscope spec MODEL" in message and "not a scalar combination" in message


def test_a_pickled_module_is_refused_in_one_clean_line(tmp_path):
    """Item 11: torch's own message (ANSI colours, a sentence cut in two) is not passed on; the line
    says why and names the two ways to read it."""
    path = tmp_path / "model.pt"
    torch.save(seeded("nanogpt"), path)
    rc, err = run(["capture", path, "--out", tmp_path / "t.nc", "--quiet"])
    assert_one_error_line(rc, err, str(path))
    assert "\x1b" not in err and "ModelSpec" in err and "--spec FILE.py" in err and "depthscope spec" in err
    assert not (tmp_path / "t.nc").exists()


def test_logits_of_a_spec_model_without_a_head_name_head():
    """Item 12: --logits on a spec model with no lm_head says how to name one."""
    model = seeded("nanogpt")
    del model.lm_head
    model.head = nn.Linear(D, VOCAB, bias=False)  # an unembedding under another name
    model.out = lambda x, targets: (model.head(model.ln_f(x)), None)
    with pytest.raises(DepthscopeError, match=r"ModelSpec\(head=") as err:
        capture(model, torch.zeros(2, CTX, dtype=torch.long), spec=model.SPEC, logits=True, progress=False)
    assert "\n" not in str(err.value)
    spec = ModelSpec(**{**model.SPEC.describe(), "head": ("ln_f", "head")})
    trace = capture(model, torch.randint(0, VOCAB, (2, CTX)), spec=spec, logits=True, progress=False)
    assert "logit_attribution" in trace


def test_one_pattern_may_be_a_string_everywhere():
    """Item 13: embed="wte" is the module wte, as writes and reads take one string."""
    model = seeded("nanogpt")
    tokens = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(0))
    listed = capture(model, tokens, spec=model.SPEC, skip_positions=0, progress=False)
    spec = ModelSpec(embed="wte", writes={"attn": "blocks.*.attn"}, reads={"attn": ["blocks.*.ln_1"]})
    assert ModelSpec(**{**model.SPEC.describe(), "embed": "wte"}).describe()["embed"] == ["wte"]
    one = capture(
        model, tokens, spec=ModelSpec(**{**model.SPEC.describe(), "embed": ["wte", "wpe"]}), progress=False
    )
    np.testing.assert_array_equal(listed["mixing"].values, one["mixing"].values)
    with pytest.raises(DepthscopeError, match="not a scalar combination"):  # (the MLP's writes unnamed)
        capture(model, tokens, spec=spec, progress=False)
    with pytest.raises(DepthscopeError, match=r"'attn' names 3: give a module path"):
        capture(model, tokens, spec=ModelSpec(embed="wte", writes={"attn": 3}, reads={}), progress=False)


class NoConfig(nn.Module):
    """No config, no position embedding: nothing but the ids says how long a window is."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, D)
        self.norms = nn.ModuleList(nn.LayerNorm(D) for _ in range(2))
        self.mlps = nn.ModuleList(nn.Linear(D, D) for _ in range(2))
        self.out_norm = nn.LayerNorm(D)

    def forward(self, ids):
        x = self.emb(ids)
        for norm, mlp in zip(self.norms, self.mlps):
            x = x + mlp(norm(x))
        return self.out_norm(x)


def test_the_context_length_comes_from_the_ids():
    """Item 14: capture(model, ids[4, 32], spec=...) reads windows of 32; without ids it says what to give."""
    spec = ModelSpec(embed="emb", writes={"mlp": "mlps.*"}, reads={"mlp": "norms.*", "readout": "out_norm"})
    trace = capture(NoConfig().eval(), torch.randint(0, VOCAB, (4, 32)), spec=spec, progress=False)
    assert trace.attrs["ctx"] == 32 and float(trace["residual_error"].max()) < 1e-5
    np.testing.assert_allclose(trace["mixing"].sel(layer="readout").dropna("source"), 1.0, atol=1e-12)
    with pytest.raises(DepthscopeError, match=r"context length .*ModelSpec\(ctx=\.\.\.\) or token ids"):
        capture(NoConfig().eval(), None, spec=spec, progress=False)


def test_custom_code_without_input_embeddings_is_one_line(tmp_path):
    """Item 6: custom modeling code (the MUDDFormer authors' shape) that defines no
    get_input_embeddings: transformers' NotImplementedError never reaches the user."""
    from depthscope.probes.specfile import load_model_with, read_spec_file, set_up
    from tests.fixtures.muddformer_like import write_muddformer_like

    directory = tmp_path / "mudd"
    with redirect_stderr(io.StringIO()):
        write_muddformer_like(directory)
    sf = read_spec_file(directory / "spec.py")
    model = load_model_with(sf, directory)
    set_up(sf, model, 4, 32)
    with pytest.raises(NotImplementedError):
        model.get_input_embeddings()  # (the premise: transformers raises for this code)
    with pytest.raises(DepthscopeError) as err:
        capture(model, torch.randint(0, 256, (4, 32)), progress=False)
    assert "\n" not in str(err.value) and "depthscope spec MODEL" in str(err.value)


class InPlace(nn.Module):
    """nanoGPT with `x = wte(idx); x += wpe(pos)` (``in_place``) or the plain sum: the same model."""

    def __init__(self, in_place: bool):
        super().__init__()
        self.inner, self.in_place = seeded("nanogpt"), in_place

    def forward(self, idx):
        m = self.inner
        x = m.wte(idx)
        pos = m.wpe(torch.arange(idx.shape[1]))
        if self.in_place:
            x += pos
        else:
            x = x + pos
        for block in m.blocks:
            x = block(x)
        return m.lm_head(m.ln_f(x))


def test_an_in_place_update_changes_no_number_ablations_included():
    """Item 9: a source updated in place after it was written (the token embedding's output, by
    `x += wpe(pos)`) is read as written, by the weights and by the ablations alike."""
    spec = ModelSpec(
        embed=["inner.wte", "inner.wpe"],
        writes={"attn": "inner.blocks.*.attn", "mlp": "inner.blocks.*.mlp"},
        reads={"attn": "inner.blocks.*.ln_1", "mlp": "inner.blocks.*.ln_2", "readout": "inner.ln_f"},
        head=("inner.ln_f", "inner.lm_head"),
    )
    tokens = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(5))
    options = dict(spec=spec, ablate="cells", skip_positions=0, progress=False)
    plain, in_place = (capture(InPlace(p).eval(), tokens, **options) for p in (False, True))
    for var in ("mixing", "contribution_share", "ablation_effect_cell"):
        np.testing.assert_allclose(in_place[var].values, plain[var].values, rtol=1e-5, atol=1e-7)
    assert np.isfinite(plain["ablation_effect_cell"].sel(layer="1.attn", source="embed").item())


def test_cells_are_refused_where_a_consumer_input_is_no_view():
    """A module read under several keys (MUDDFormer's layer 0) or a whole block's input (the block
    carries it on into the stream): replacing one consumer's input would change others too, so an
    ablation is refused in one line that says which, never measured wrongly."""
    model = seeded("mudd")
    shared = ModelSpec(
        embed="wte",
        writes={"attn": "blocks.*.attn", "mlp": "blocks.*.mlp"},
        reads={
            "attn.q": "blocks.*.q_norm",
            "attn.k": "blocks.*.q_norm",
            "mlp": "blocks.*.ln_2",
            "readout": "ln_f",
        },
    )
    tokens = torch.randint(0, VOCAB, (2, CTX))
    with pytest.raises(
        DepthscopeError, match=r"views of the stream.*blocks\.0\.q_norm is read under several keys"
    ):
        capture(model, tokens, spec=shared, ablate="cells", progress=False)
    dense = seeded("denseformer")
    with pytest.raises(DepthscopeError, match=r"views of the stream.*blocks\.0's input is read"):
        capture(dense, tokens, spec=dense.SPEC, ablate="sources", progress=False)


class Short(NoConfig):
    """A model whose context (4 positions) is shorter than the probe's 8 (it asserts so), returning a
    dict: its logits under ``key``."""

    def __init__(self, key: str = "logits"):
        super().__init__()
        self.lm_head, self.key = nn.Linear(D, VOCAB), key

    def forward(self, ids):
        assert ids.shape[1] <= 4, "at most 4 positions"
        return {self.key: self.lm_head(super().forward(ids))}


def test_a_short_context_and_a_dict_output_are_read():
    """The probe runs on the model's own context where it is shorter than 8 positions; the logits of a
    model returning a dict are its "logits" entry (a dict without one is one line)."""
    spec = ModelSpec(
        embed="emb", writes={"mlp": "mlps.*"}, reads={"mlp": "norms.*", "readout": "out_norm"}, ctx=4
    )
    ids = torch.randint(0, VOCAB, (4, 4))
    trace = capture(Short().eval(), ids, spec=spec, logits=True, progress=False)
    assert trace.attrs["ctx"] == 4 and float(trace["residual_error"].max()) < 1e-5
    with pytest.raises(DepthscopeError, match=r"holds no logits"):
        capture(Short("hidden").eval(), ids, spec=spec, logits=True, progress=False)
