"""Post-LN by structure: any transformers model whose layers compute LN(x + attn), then LN(. + mlp)
is read through its LayerNorms, found from what its modules compute on a probe forward, whatever
its classes (BART-family decoders, GPT-1, BERT variants the layouts table does not name).

Two checks: a model the ``LAYOUTS`` table reads gives the same trace when its layout is found
instead (two computations, one answer); and decoders the table does not name equal the independent
decomposition of test_post_ln.py (plain hooks on Embeddings and LayerNorms, terms carried by hand).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from depthscope.probes import capture
from depthscope.probes.adapters import post_ln
from depthscope.probes.adapters.structure import Probe, Refused
from tests.architectures import tiny_model
from tests.probes.adapters.test_post_ln import MODELS, config, independent_decomposition, tokens


@pytest.mark.parametrize("kind", ["bert", "roberta", "electra-projected", "distilbert"])
def test_a_found_layout_reads_a_tabled_model_as_its_row_does(kind):
    torch.manual_seed(0)
    model = MODELS[kind](config(kind, 128)).eval().double()
    found = post_ln.find_layout(model, Probe(model, 128))
    row = post_ln.LAYOUTS[kind.removesuffix("-projected")]
    tabled = post_ln.spec_of(model)  # the row's spec: the same norms and embeddings, found
    assert (found.norms, found.embed) == (tabled.norms, tabled.embed)
    assert found.norms["ln2"].endswith(row.ln2)
    by_row = capture(model, tokens(), batch_size=2, skip_positions=0)
    by_structure = capture(
        model,
        tokens(),
        batch_size=2,
        skip_positions=0,
        adapter=post_ln.build(model, found, origin="structure"),
    )
    assert (by_row.attrs["layout"], by_structure.attrs["layout"]) == ("post-ln layout", "post-ln structure")
    assert list(by_structure["source"].values) == list(by_row["source"].values)
    for var in ("contribution_share", "mixing", "norm_share", "input_rms", "source_rms"):
        np.testing.assert_allclose(by_structure[var].values, by_row[var].values, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("model_type", ["bart", "ernie", "bert-generation", "data2vec-text"])
def test_untabled_post_ln_models_equal_the_independent_decomposition(model_type):
    torch.manual_seed(0)
    model = tiny_model(model_type).eval().double()
    toks = tokens(2, 16)
    trace = capture(model, toks, batch_size=2, skip_positions=0)
    assert trace.attrs["family"] == "post-ln" and trace.attrs["layout"] == "post-ln structure"
    assert float(trace["residual_error"].max()) < 1e-12
    rows = independent_decomposition(model, toks)
    assert len(rows) == trace.sizes["layer"]
    for label, (share, mixing) in zip(trace["layer"].values, rows):
        row = trace.sel(layer=label)
        np.testing.assert_allclose(
            row["contribution_share"].dropna("source"), share, atol=1e-10, err_msg=label
        )
        np.testing.assert_allclose(row["mixing"].dropna("source"), mixing, rtol=1e-10, err_msg=label)


@pytest.mark.parametrize("model_type", ["marian", "rembert", "openai-gpt", "roformer", "git"])
def test_post_ln_models_without_an_embedding_norm_or_with_a_projection_rebuild_exactly(model_type):
    """Marian (no LayerNorm after its embeddings; positions of shape [pos, d]), RemBERT (a linear map
    from the embeddings' width into the stream's), GPT-1 (layers returning lists), RoFormer (a position
    embedding module used for rotations, not added) and GIT: in float64 every
    input is rebuilt from its terms to 1e-12 and the shares sum to 1."""
    torch.manual_seed(0)
    model = tiny_model(model_type).eval().double()
    trace = capture(model, tokens(2, 16), batch_size=2, skip_positions=0)
    assert trace.attrs["layout"] == "post-ln structure" and float(trace["residual_error"].max()) < 1e-12
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-12)


def test_a_pre_ln_model_is_not_found_post_ln():
    model = tiny_model("llama").eval()
    with pytest.raises(Refused, match="LayerNorms on the stream|not its last LayerNorm"):
        post_ln.find_layout(model, Probe(model, model.get_input_embeddings().num_embeddings))
