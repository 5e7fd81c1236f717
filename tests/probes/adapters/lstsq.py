"""The independent check of a foreign family: plain forward hooks on the transformers modules record
every source and every consumer input, and least squares of each input on the sources written
before it recovers that input's per-token coefficients, knowing nothing of how the family mixes.

Used by the tests of the transformers families with depth mixing (glm5_next, hy_v4, inkling2,
gemma3n): what the adapter unrolls from the model's own weights and what least squares finds in
the tensors must agree, token by token (compared through the trace's mean and spread)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def record(model, tokens: Tensor, taps: list[tuple[str, str, str]]) -> dict[str, list[Tensor]]:
    """Run ``model(tokens)`` once with plain hooks; ``taps`` are (name, module path, ``in`` | ``out``):
    a module's first input (positional or ``hidden_states``) or its output (the first element of a
    tuple). Every firing is kept, in order, as float64 [batch, pos, d]."""
    seen: dict[str, list[Tensor]] = {name: [] for name, _, _ in taps}
    handles = []

    def out_hook(name):
        def hook(module, args, out):
            seen[name].append((out[0] if isinstance(out, tuple) else out).detach().double())

        return hook

    def in_hook(name):
        def hook(module, args, kwargs):
            seen[name].append((args[0] if args else kwargs["hidden_states"]).detach().double())

        return hook

    try:
        for name, path, where in taps:
            module = model.get_submodule(path)
            if where == "out":
                handles.append(module.register_forward_hook(out_hook(name)))
            else:
                handles.append(module.register_forward_pre_hook(in_hook(name), with_kwargs=True))
        with torch.no_grad():
            model(tokens)
    finally:
        for h in handles:
            h.remove()
    return seen


def lstsq_weights(sources: list[Tensor], h: Tensor) -> tuple[Tensor, float]:
    """Per-token least-squares coefficients [batch, pos, n] of ``h`` [batch, pos, d] on the ``sources``
    (each [batch, pos, d]), in float64 with the columns scaled to unit norm, and the largest
    relative residual |h - sum_s w_s v_s| / |h| over the tokens. A source that is exactly zero on
    every token (a write initialised to zero) has no recoverable coefficient: NaN."""
    live = [j for j, v in enumerate(sources) if bool(v.abs().amax() > 0)]
    a = torch.stack([sources[j] for j in live], dim=-1)  # [batch, pos, d, n]
    scale = torch.linalg.vector_norm(a, dim=-2, keepdim=True)
    w = torch.linalg.lstsq(a / scale, h.unsqueeze(-1)).solution / scale.transpose(-1, -2)
    rebuilt = (a @ w).squeeze(-1)
    resid = torch.linalg.vector_norm(h - rebuilt, dim=-1) / torch.linalg.vector_norm(h, dim=-1)
    out = h.new_full((*h.shape[:-1], len(sources)), float("nan"))
    out[..., live] = w.squeeze(-1)
    return out, float(resid.max())


def compare(trace, rows: dict[str, Tensor], rtol: float = 1e-4) -> float:
    """Assert that the trace's ``mixing`` and ``mixing_std`` are the token mean and spread of the
    independent per-token ``rows`` (label -> [batch, pos, n]); the largest deviation of a mean,
    relative to the row's largest |weight|."""
    worst = 0.0
    for label, w in rows.items():
        n = w.shape[-1]
        flat = w.flatten(0, 1).numpy()
        live = ~np.isnan(flat).any(0)  # sources with a recoverable coefficient
        mean = trace["mixing"].sel(layer=label).values[:n][live]
        std = trace["mixing_std"].sel(layer=label).values[:n][live]
        flat = flat[:, live]
        scale = max(float(np.abs(flat).max()), 1e-12)
        np.testing.assert_allclose(mean, flat.mean(0), rtol=rtol, atol=rtol * scale, err_msg=label)
        np.testing.assert_allclose(std, flat.std(0), rtol=10 * rtol, atol=10 * rtol * scale, err_msg=label)
        assert np.isnan(trace["mixing"].sel(layer=label).values[n:]).all(), label
        worst = max(worst, float(np.abs(mean - flat.mean(0)).max()) / scale)
    return worst


def rows_of(
    seen: dict[str, Tensor], order: list[str], inputs: dict[str, str]
) -> tuple[dict[str, Tensor], float]:
    """Least-squares rows of every consumer: ``inputs`` maps a consumer label to (the name of its
    recorded input, n), n the number of sources in ``order`` written before it; and the largest
    relative residual of any of them."""
    rows, worst = {}, 0.0
    for label, (name, n) in inputs.items():
        rows[label], resid = lstsq_weights([seen[s] for s in order[:n]], seen[name])
        worst = max(worst, resid)
    return rows, worst


def assert_shares(
    trace, rows: dict[str, Tensor], seen: dict[str, Tensor], order: list[str], inputs, skip: int
):
    """The trace's ``contribution_share`` against sum_t <w_s v_s, h> / sum_t |h|^2 from the
    independent rows, over the positions after the first ``skip``."""
    for label, w in rows.items():
        h = seen[inputs[label][0]][:, skip:]
        n = w.shape[-1]
        terms = torch.stack([w[:, skip:, j, None] * seen[s][:, skip:] for j, s in enumerate(order[:n])])
        terms = terms.nan_to_num()  # a source that is zero everywhere contributes nothing
        share = (terms * h).sum((1, 2, 3)) / h.pow(2).sum()
        got = trace["contribution_share"].sel(layer=label).values[:n]
        np.testing.assert_allclose(got, share.numpy(), atol=1e-5, err_msg=label)


def save_byte_tokenizer(directory) -> None:
    """Save a byte-level tokenizer (256 ids, no merges) beside a model: without tokenizer files,
    transformers 5.24 makes one from config.json alone (Gemma's maps every word to one id)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(directory)


def cli_windows(directory, ctx: int, n_tokens: int, seed: int = 0) -> Tensor:
    """The windows `depthscope capture DIR --ctx --tokens --seed` reads from the default corpus
    through the directory's tokenizer."""
    from transformers import AutoTokenizer

    from depthscope.corpus import token_windows
    from depthscope.probes.adapters.hf import encoder

    tok = AutoTokenizer.from_pretrained(str(directory))
    return token_windows(None, ctx, n_tokens, seed, encode=encoder(tok), vocab=len(tok))[0]
