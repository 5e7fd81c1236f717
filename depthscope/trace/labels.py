"""The label vocabulary of a trace: kinds of sources and consumers, labels, and blocks.

Labels (docs/design.md "The trace"): a sublayer is ``"{block}.{kind}"`` (``"3.attn"``), a consumer
with several inputs has one row per view (``"3.attn.q"``), the final read-out is ``"readout"`` and
the token embedding ``"embed"``. The block of a label is its leading integer (``"3"``); the
embedding, its LayerNorm bias and anything else before the first block belong to ``"embed"``;
the read-out is its own block. These are plain text: nothing here knows which model wrote them.
"""

from __future__ import annotations

from typing import Literal, get_args

# The kinds of sources and consumers: every kind label in a trace is one of these.
Kind = Literal["attn", "mlp", "swa", "ssm", "readout", "embed", "bias", "block"]
ATTN: Kind = "attn"
MLP: Kind = "mlp"
SWA: Kind = "swa"  # sequence-axis ShortSWA's extra sublayer
SSM: Kind = "ssm"  # a state-space, convolution or linear-attention mixer (mamba, jamba, lfm2, qwen3_next)
READOUT: Kind = "readout"
EMBED: Kind = "embed"
BIAS: Kind = "bias"  # a post-LN model's LayerNorm bias: a source of its own
BLOCK: Kind = "block"  # a whole block, in a block-level view of a deep model
KINDS: tuple[Kind, ...] = get_args(Kind)
SUBLAYER_KINDS: tuple[Kind, ...] = (ATTN, MLP, SWA, SSM)  # sources written by a sublayer


def label(block: int, kind: str) -> str:
    """Trace label of a sublayer (a source or consumer): ``3.attn``; the read-out is ``readout``."""
    return READOUT if kind == READOUT else f"{block}.{kind}"


def block_of(label: str) -> str:
    """The block a source or consumer label belongs to.

    ``"3.attn.q"`` -> ``"3"``; embeddings (and their LayerNorm bias) -> ``"embed"``; ``"readout"`` stays.
    """
    head = str(label).split(".", 1)[0]
    return head if head.isdigit() or head == READOUT else EMBED
