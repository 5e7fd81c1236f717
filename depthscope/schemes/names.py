"""The hook vocabulary, built in one place (TransformerLens grammar).

Sources (what is written to the depth history, in execution order):
    hook_embed                         token embedding                 [batch, pos, d_model]
    blocks.{i}.hook_{kind}_out         sublayer output (kind: attn, mlp, swa)

Consumers (every distinct sublayer input, then the read-out):
    blocks.{i}.{kind}_mix.hook_in       the mixed input handed to the sublayer
    blocks.{i}.{kind}_mix.hook_weights  per-token weights over the sources written so far,
                                        in the delta basis (embedding + sublayer outputs):
                                        [batch, pos, source] or [batch, pos, source, d_model]
    readout_mix.hook_in / hook_weights  the same for the input of the final norm
A consumer with several inputs (DCA's attention) has one view per input:
    blocks.{i}.attn_mix.{q,k,v}.hook_in / hook_weights
Native per-scheme hooks hang off the same mixer prefix (e.g. blocks.{i}.attn_mix.hook_h_res).

Also here: the TransformerLens names of a standard residual stream that the TransformerBridge
adapter reads. The kinds of sources and consumers and the trace labels are the trace's vocabulary
(``depthscope.trace.labels``), re-exported here for the schemes.
"""

from __future__ import annotations

from depthscope.trace.labels import (  # the label vocabulary lives with the trace; schemes use it
    ATTN,
    BIAS,
    BLOCK,
    EMBED,
    KINDS,
    MLP,
    READOUT,
    SSM,
    SUBLAYER_KINDS,
    SWA,
    Kind,
    label,
)

__all__ = [
    "ATTN",
    "BIAS",
    "BLOCK",
    "EMBED",
    "KINDS",
    "MLP",
    "READOUT",
    "SSM",
    "SUBLAYER_KINDS",
    "SWA",
    "Kind",
    "label",
]

HOOK_EMBED = "hook_embed"
HOOK_POS_EMBED = "hook_pos_embed"  # learned positions (TransformerLens models)


def source_out(block: int, kind: str) -> str:
    """Hook name of a sublayer's output, e.g. ``blocks.3.hook_attn_out``."""
    return f"blocks.{block}.hook_{kind}_out"


def mixer(block: int, kind: str, view: str | None = None) -> str:
    """Module path of a consumer's mixer, e.g. ``blocks.3.attn_mix.q`` or ``readout_mix``."""
    base = "readout_mix" if kind == READOUT else f"blocks.{block}.{kind}_mix"
    return f"{base}.{view}" if view else base


def mix_in(block: int, kind: str, view: str | None = None) -> str:
    """Hook name of a consumer's mixed input."""
    return f"{mixer(block, kind, view)}.hook_in"


def mix_weights(block: int, kind: str, view: str | None = None) -> str:
    """Hook name of a consumer's per-token weights over sources (delta basis)."""
    return f"{mixer(block, kind, view)}.hook_weights"


def sublayer_hook(block: int, kind: str, name: str) -> str:
    """Hook name of a native quantity on a sublayer, e.g. ``blocks.3.attn.hook_beta`` (DDL's gate)."""
    return f"blocks.{block}.{kind}.{name}"


def mixer_hook(block: int, kind: str, name: str) -> str:
    """Hook name of a native quantity on a consumer's mixer, e.g. ``blocks.3.attn_mix.hook_h_res``."""
    return f"{mixer(block, kind)}.{name}"


# TransformerLens names of a standard residual stream (TransformerBridge models)
def resid_pre(block: int) -> str:
    return f"blocks.{block}.hook_resid_pre"


def resid_mid(block: int) -> str:
    return f"blocks.{block}.hook_resid_mid"


def resid_post(block: int) -> str:
    return f"blocks.{block}.hook_resid_post"
