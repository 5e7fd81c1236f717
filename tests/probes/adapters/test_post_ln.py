"""Post-LN encoders of every type the adapter reads (bert, roberta, xlm-roberta, camembert, electra with
and without its embedding projection, distilbert), each a tiny random model saved as a directory: the
propagated terms rebuild transformers' own hidden states, the shares and weights equal an independent
decomposition from plain LayerNorm hooks, `depthscope capture DIR` works, and a chunked feed-forward
gives the trace of the unchunked model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as T

from depthscope.cli import main
from depthscope.corpus import token_windows
from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.adapters import resolve
from depthscope.probes.load import load_model
from depthscope.trace import load_trace
from tests.probes.test_bridge import model_dir
from tests.probes.test_huggingface import collect_term_sums

SIZE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
POSITIONS = 40  # max_position_embeddings: a context of 40, or 38 where positions start after the pad id


def config(kind: str, vocab: int, **extra):
    """A tiny random config of ``kind``; ELECTRA's discriminator with embeddings narrower than the stream."""
    if kind == "distilbert":
        return T.DistilBertConfig(
            vocab_size=vocab,
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=POSITIONS,
            **extra,
        )
    cls = {"bert": T.BertConfig, "roberta": T.RobertaConfig, "xlm-roberta": T.XLMRobertaConfig}.get(kind)
    cls = cls or {"camembert": T.CamembertConfig}.get(kind, T.ElectraConfig)
    if kind.startswith("electra"):
        extra = {"embedding_size": 16 if kind == "electra-projected" else 32, **extra}
    return cls(vocab_size=vocab, max_position_embeddings=POSITIONS, **SIZE, **extra)


# each type with a head class (the base model under a prefix; tied decoders are not missing weights)
MODELS = {
    "bert": T.BertForMaskedLM,
    "roberta": T.RobertaForMaskedLM,
    "xlm-roberta": T.XLMRobertaModel,
    "camembert": T.CamembertForMaskedLM,
    "electra": T.ElectraForMaskedLM,
    "electra-projected": T.ElectraForPreTraining,
    "distilbert": T.DistilBertForMaskedLM,
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """kind -> a saved directory (model and tokenizer), made on first use."""
    dirs = {}

    def get(kind):
        if kind not in dirs:
            d = tmp_path_factory.mktemp(kind)
            dirs[kind] = model_dir(d, lambda v: MODELS[kind](config(kind, v)))
        return dirs[kind]

    return get


def tokens(n=3, pos=24, seed=0):
    """Random ids above the special tokens (the RoBERTa pad id, 1, would restart its positions)."""
    return torch.randint(5, 99, (n, pos), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def independent_decomposition(model, toks, base=None):
    """Per consumer (each post-LN LayerNorm's output in call order, ELECTRA's projection applied to
    the first), each term's share <c, h> / |h|^2 over all tokens and its token-mean 1/sigma product,
    from plain hooks on every Embedding and LayerNorm of the base model (or ``base``) only: the writes are
    each LayerNorm's input minus the stream before it, the terms carried by hand (float64).
    """
    base = model.base_model if base is None else base
    calls, handles = [], []
    for module in base.modules():
        if isinstance(module, (torch.nn.Embedding, torch.nn.LayerNorm)):
            handles.append(module.register_forward_hook(lambda m, a, out: calls.append((m, a[0], out))))
    model(toks)
    for h in handles:
        h.remove()
    project = getattr(base, "embeddings_project", None)
    terms, scales, rows, stream = [], [], [], None
    for module, x, out in calls:
        if isinstance(module, torch.nn.Embedding):
            terms.append(out.expand(toks.shape[0], -1, -1))  # position embeddings are shared over the batch
            scales.append(torch.ones(out.shape[:2]).double().expand(toks.shape[0], -1))
            continue
        if stream is not None:  # the write is what was added to the stream
            terms.append(x - stream)
            scales.append(torch.ones_like(scales[0]))
        inv = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + module.eps)
        terms = [module.weight * (c - c.mean(-1, keepdim=True)) * inv for c in terms] + [
            module.bias.expand_as(x)
        ]
        scales = [s * inv.squeeze(-1) for s in scales] + [torch.ones_like(scales[0])]
        stream = out
        if project is not None and len(rows) == 0:
            terms = [c @ project.weight.T for c in terms] + [project.bias.expand_as(project(out))]
            scales.append(torch.ones_like(scales[0]))
            stream = project(out)
        assert float((sum(terms) - stream).abs().max()) < 1e-10  # the terms are the stream
        rows.append(
            (
                np.array([float((c * stream).sum() / stream.pow(2).sum()) for c in terms]),
                np.array([float(s.mean()) for s in scales]),
            )
        )
    return rows


@pytest.mark.parametrize("kind", list(MODELS))
def test_terms_rebuild_hidden_states_and_shares_equal_an_independent_decomposition(kind, saved):
    model = load_model(saved(kind))
    assert model.config.model_type == kind.removesuffix("-projected")
    sums = collect_term_sums(model, tokens())
    with torch.no_grad():
        hs = model(tokens(), output_hidden_states=True).hidden_states
    for i, h in enumerate(hs):  # every layer's input and the last layer's output
        key = f"{i}.attn" if i < len(hs) - 1 else "readout"
        assert float((sums[key] - h).norm() / h.norm()) < 1e-5, key

    model = model.double()
    trace = capture(model, tokens(), batch_size=2, skip_positions=0)
    assert trace.attrs["family"] == "post-ln" and float(trace["residual_error"].max()) < 1e-12
    rows = independent_decomposition(model, tokens())
    assert len(rows) == trace.sizes["layer"] == 2 * model.config.num_hidden_layers + 1
    for label, (share, mixing) in zip(trace["layer"].values, rows):
        row = trace.sel(layer=label)
        np.testing.assert_allclose(
            row["contribution_share"].dropna("source"), share, atol=1e-10, err_msg=label
        )
        np.testing.assert_allclose(row["mixing"].dropna("source"), mixing, rtol=1e-10, err_msg=label)
    biases = [s for s, k in zip(trace["source"].values, trace["source_kind"].values) if k == "bias"]
    assert ("embed.proj" in biases) is (kind == "electra-projected")
    if kind == "electra-projected":  # the word embeddings' value: their image in the stream's width
        with torch.no_grad():
            base = model.base_model
            word = base.embeddings.word_embeddings(tokens()) @ base.embeddings_project.weight.T
        assert float(trace["source_rms"].sel(source="embed")) == pytest.approx(
            float(word.pow(2).mean().sqrt())
        )


@pytest.mark.parametrize("kind", ["bert", "distilbert", "electra-projected"])
def test_a_chunked_feed_forward_gives_the_trace_of_the_unchunked_model(kind):
    """Same weights, chunking off and on (hooks inside the feed-forward fire once per chunk): equal
    traces; a window that is not a multiple of the chunk is one line."""
    torch.manual_seed(0)
    plain = MODELS[kind](config(kind, 99)).double().eval()
    chunked = MODELS[kind](config(kind, 99, chunk_size_feed_forward=8)).double().eval()
    chunked.load_state_dict(plain.state_dict())
    calls = []
    linear = next(m for name, m in chunked.named_modules() if name.endswith(("0.output.dense", "0.ffn.lin2")))
    linear.register_forward_hook(lambda m, a, out: calls.append(out.shape[1]))
    a = capture(plain, tokens(4, 24), batch_size=2, rank=True)
    b = capture(chunked, tokens(4, 24), batch_size=2, rank=True)
    # the probe forward of one chunk that checks the spec, then three chunks per batch: the hooks saw chunks
    assert calls == [8] + [8, 8, 8] * 2
    assert set(a.data_vars) == set(b.data_vars)
    for name in a.data_vars:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-12, atol=1e-14, err_msg=name)
    with pytest.raises(DepthscopeError, match="window must be a multiple of 8; got 20"):
        capture(chunked, tokens(2, 20))


@pytest.mark.parametrize("kind", list(MODELS))
def test_capture_a_saved_directory_from_the_cli(kind, saved, tmp_path):
    """`depthscope capture DIR` on text read with the saved tokenizer: the shares equal the independent
    decomposition of the same windows (the model in float64 there, float32 in the capture)."""
    out = tmp_path / "t.nc"
    argv = ["capture", str(saved(kind)), "--out", str(out), "--tokens", "128", "--ctx", "32", "--quiet"]
    assert main(argv) == 0
    trace = load_trace(out)
    assert trace.attrs["family"] == "post-ln" and trace.attrs["ctx"] == 32
    assert trace.attrs["tokens"] == 4 * 32 and float(trace["residual_error"].max()) < 1e-4
    model = load_model(saved(kind))
    windows, _ = token_windows(None, 32, 128, encode=resolve(model).encode, vocab=model.config.vocab_size)
    rows = independent_decomposition(model.double(), windows)
    for label, (share, _) in zip(trace["layer"].values, rows, strict=True):
        got = trace["contribution_share"].sel(layer=label).dropna("source")
        np.testing.assert_allclose(got, share, atol=1e-5, err_msg=label)


def test_roberta_context_starts_after_the_pad_id(saved):
    """RoBERTa numbers positions from pad_token_id + 1: its context is two short of its position table."""
    model = load_model(saved("roberta"))
    assert capture(model, tokens(1, POSITIONS - 2)).attrs["ctx"] == POSITIONS - 2
    with pytest.raises(DepthscopeError, match=f"between 1 and the model's context {POSITIONS - 2}"):
        capture(model, None, ctx=POSITIONS, n_tokens=64)


def test_an_encoder_without_a_tokenizer_asks_for_ids_or_a_tokenizer(saved):
    """Its ids are word pieces: text is never read as bytes, even with a vocabulary of 256 or more."""
    torch.manual_seed(0)
    model = T.BertModel(config("bert", 300)).eval()
    with pytest.raises(
        DepthscopeError,
        match=r"no tokenizer.*--tokenizer NAME_OR_DIR.*pass token ids \(Python: capture\(model, ids\)\)",
    ):
        capture(model, None, n_tokens=64, ctx=32)
    tok = T.AutoTokenizer.from_pretrained(saved("bert"))
    assert capture(model, None, n_tokens=64, ctx=32, tokenizer=tok).attrs["tokens"] == 64


def test_biases_and_shared_embeddings_are_carried_as_vectors_with_the_dense_terms_statistics(saved):
    """The LayerNorm biases and the token type (one vector at every token) and the position embedding
    (one per position) are carried as vectors times their accumulated 1/sigma, the rest whole; with
    positions skipped, the read-out's shares and norm shares from those equal the same statistics
    computed from the whole terms, and every input is rebuilt."""
    model = load_model(saved("bert")).double()
    ad, got = resolve(model), {}
    taps = [(c.weights, lambda tm, key=c.label: got.__setitem__(key, tm)) for c in ad.consumers]
    with torch.no_grad(), ad.attach(model, taps):
        model(tokens())
    n_layers = model.config.num_hidden_layers
    readout = got["readout"]
    sizes = {g: v.shape for g, (v, _) in zip(("const", "window"), readout.vecs)}
    assert readout.dense.shape[0] == 1 + 2 * n_layers  # the word embedding and the sublayer writes
    assert sizes["const"][:3] == (1 + 2 * n_layers + 1, 1, 1)  # token type, every LayerNorm bias
    assert sizes["window"][:3] == (1, 1, tokens().shape[1])  # the position embedding
    skip = 2
    whole = readout.full()[:, :, skip:]  # [source, batch, pos, d], the skipped positions cut
    h = whole.sum(0)
    norms = torch.linalg.vector_norm(whole, dim=-1).sum((1, 2))
    share = (whole * h).sum((1, 2, 3)) / h.pow(2).sum()
    trace = capture(model, tokens(), batch_size=3, skip_positions=skip)
    row = trace.sel(layer="readout")
    assert float(trace["residual_error"].max()) < 1e-12
    np.testing.assert_allclose(row["norm_share"].values, (norms / norms.sum()).numpy(), rtol=1e-10)
    np.testing.assert_allclose(row["contribution_share"].values, share.numpy(), atol=1e-12)
