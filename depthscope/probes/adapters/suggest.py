"""A model's best-guess ``ModelSpec``, in its own module names: ``suggest_spec(model)`` (``depthscope
spec MODEL`` prints it as Python to edit and pass to ``--spec``), and discovery for a plain module
no family knows.

The guess, from the module tree and, where the model runs on plain token ids, the order of one
probe forward (batch 2 x 8 positions):

* embeddings: the ``nn.Embedding`` modules outside the blocks, the one called on the token ids
  first (a token embedding, then a learned position embedding);
* blocks: the longest ``nn.ModuleList`` of one class whose layers hold a child named like a
  sublayer (``attn``, ``attention``, ``mlp``, ``feed_forward``, ``mamba`` ...);
* in every block, its children in the order the forward calls them (the items of a child list,
  such as MUDDFormer's ``attention_norms``, count as children): the norms called before a
  sublayer are its reads (one norm: the sublayer's input; three: its query, key and value views)
  and the sublayer is a write of the kind its name says; a sublayer with no norm before it reads
  the stream itself (its input is the consumer). Blocks that differ (MUDDFormer's layer 0 reads its
  three views from one ``attention_norm``) are named one by one beside the common pattern;
* the read-out: the last norm called outside the blocks (else the last one registered).

``build_spec`` then checks the guess like any spec; the suggestion says what it checked and what it
could not decide (a forward that needs more than ids, a child whose kind its name does not say).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch

from depthscope.errors import DepthscopeError, first_line
from depthscope.probes.adapters.spec import ModelSpec, build_spec
from depthscope.probes.adapters.structure import Probe, path_word
from depthscope.trace.labels import READOUT

VIEWS = ("q", "k", "v")
REFUSED = "checked on a probe forward: refused: "


@dataclass(frozen=True)
class Suggestion:
    """A guessed spec (None where nothing could be guessed) and notes on what was and was not decided."""

    spec: ModelSpec | None
    notes: tuple[str, ...]
    model: str  # the model's class name

    def python(self, helpers: str | None = None) -> str:
        """The suggestion as a spec file: Python to edit and pass to ``--spec`` (``helpers``: the spec
        file whose setup() and load() it reuses, by running it).
        """
        lines = [f"# depthscope spec: a ModelSpec to start from for {self.model}; edit it, then run", "#"]
        lines += ["#   depthscope capture MODEL --spec THIS_FILE.py --out trace.nc", "#"]
        lines += [f"# {note}" for note in self.notes]
        lines += ["", "from depthscope import ModelSpec", ""]
        if self.spec is None:
            lines += [
                "spec = ModelSpec(",
                '    embed=["EMBEDDING"],  # the token embedding (then a position embedding, if any)',
                '    writes={"attn": "LAYERS.*.ATTENTION", "mlp": "LAYERS.*.MLP"},  # outputs added',
                '    reads={"attn": "LAYERS.*.NORM_1", "mlp": "LAYERS.*.NORM_2", "readout": "FINAL_NORM"},',
                ")",
            ]
        else:
            d = self.spec.describe()
            lines += ["spec = ModelSpec(", f"    embed={_py(d['embed'])},"]
            for what in ("writes", "norms", "reads", "static"):
                if what in d:
                    lines.append(f"    {what}={{")
                    lines += [
                        f"        {json.dumps(k)}: {json.dumps(v) if what == 'static' else _py(v)},"
                        for k, v in d[what].items()
                    ]
                    lines.append("    },")
            if self.spec.ctx is not None:  # a context the model's config does not say (RoBERTa's)
                lines.append(f"    ctx={self.spec.ctx},")
            lines.append(")")
        if helpers is not None:
            return (
                "\n".join(
                    lines
                    + [
                        "",
                        f"# setup() and load(), where {helpers} defines them",
                        "import runpy  # noqa: E402",
                        "",
                        f"_given = runpy.run_path({json.dumps(helpers)})",
                        'setup, load = _given.get("setup"), _given.get("load")',
                    ]
                )
                + "\n"
            )
        lines += [
            "",
            "# Optional: a model that must build caches before a forward (batch_size and ctx are passed",
            "# when the signature takes them), and a model depthscope cannot load from MODEL itself:",
            "#",
            "# def setup(model, batch_size, ctx):",
            "#     model.setup_caches(max_batch_size=batch_size, max_seq_length=ctx)",
            "#",
            "# def load(path):",
            "#     ...  # build the model from path and return it",
        ]
        return "\n".join(lines) + "\n"


def _py(value: list[str] | dict[str, str]) -> str:
    return json.dumps(value[0]) if isinstance(value, list) and len(value) == 1 else json.dumps(value)


def _is_norm(module: Any) -> bool:
    return "norm" in type(module).__name__.lower()


def _calls(model: Any, forward: Any, vocab: int) -> tuple[list[str], str | None, str | None]:
    """The paths of the modules a probe forward (``structure.Probe``) calls, in call order, the
    embedding called on the token ids, and why the forward failed (None: it ran).
    """
    try:
        probe = Probe(model, vocab, forward)
    except DepthscopeError as err:  # a model that needs more than ids: the tree alone
        return [], None, first_line(err)
    order = [c.path for c in probe.calls if c.path]
    token = next((c.path for c in probe.calls if c.on_ids and isinstance(c.module, torch.nn.Embedding)), None)
    return order, token, None


def _blocks(model: Any) -> tuple[str, Any] | None:
    """The longest ModuleList of one class whose layers hold a child named like a sublayer."""
    lists = [
        (path, m)
        for path, m in model.named_modules()
        if isinstance(m, torch.nn.ModuleList)
        and len(m)
        and len({type(c) for c in m}) == 1
        and isinstance(m[0], torch.nn.Module)
        and any(path_word(name) for name, _ in m[0].named_children())
    ]
    return max(lists, key=lambda pm: len(pm[1])) if lists else None


def _units(block: Any, prefix: str, order: list[str]) -> list[tuple[str, Any]]:
    """A block's children (the items of a child list or dict) in call order (registration order
    where the forward did not run or never called them).
    """
    units = []
    for name, child in block.named_children():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            units += [(f"{name}.{k}", c) for k, c in child.named_children()]
        else:
            units.append((name, child))
    if order:
        first = {p: i for i, p in reversed(list(enumerate(order)))}
        called = [(n, c) for n, c in units if f"{prefix}.{n}" in first]
        return sorted(called, key=lambda nc: first[f"{prefix}.{nc[0]}"])
    return units


def _walk(units: list[tuple[str, Any]]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(writes kind -> child, reads key -> child, notes) of one block's children in call order."""
    writes: dict[str, str] = {}
    reads: dict[str, str] = {}
    notes: list[str] = []
    pending: list[str] = []
    for name, child in units:
        if _is_norm(child):
            pending.append(name)
            continue
        kind = path_word(name.split(".")[0])
        if kind is None or kind == "embed":
            continue  # dropout, rotary tables, a gate: no sublayer
        if kind in writes:
            notes.append(
                f"two {kind} sublayers in one block ({writes[kind]}, {name}): the second is left out"
            )
            pending = []
            continue
        writes[kind] = name
        if len(pending) == 3:
            reads.update({f"{kind}.{v}": p for v, p in zip(VIEWS, pending)})
        elif len(pending) > 1:
            notes.append(f"{len(pending)} norms before {name} ({', '.join(pending)}): the last is read")
            reads[kind] = pending[-1]
        else:
            reads[kind] = pending[0] if pending else name
        pending = []
    return writes, reads, notes


def _pattern(root: str, per_block: list[str | None]) -> list[str]:
    """Patterns naming ``per_block[i]`` under block i: the common one with ``*``, the others by index."""
    common = Counter(p for p in per_block if p).most_common(1)[0][0]
    odd = [f"{root}.{i}.{p}" for i, p in enumerate(per_block) if p and p != common]
    return [*odd, f"{root}.*.{common}"]


def suggest_spec(model: Any, forward: Any = None, *, check: bool = True) -> Suggestion:
    """The model's best-guess ModelSpec and what was and was not decided (see the module docstring),
    checked on a probe forward (``check``) with a note of what ``build_spec`` makes of it.
    ``forward(model, ids)`` runs the model where it needs more than ``model(ids)``.
    """
    from depthscope.probes.adapters import huggingface, post_ln
    from depthscope.probes.adapters.registry import detecting

    family = detecting(model) if forward is None else None
    if family is not None and family.name in (huggingface.NAME, post_ln.NAME):  # what capture reads
        if family.name == post_ln.NAME:
            spec, how = post_ln.spec_of(model), f"the {model.config.model_type} row of its layouts"
        else:
            spec, how = huggingface.plan_spec(model)
        if spec is not None:
            gap = huggingface.reading_gap(model, spec) if check else ""
            note = (
                f"the {family.name} family reads this model ({how}): this spec names the modules it reads; "
            )
            if spec.norms:  # post-LN: every term carried through the norms, nothing to find
                note += "with --spec every term is carried through its norms as the family does; it reads "
            else:
                note += "with --spec their weights are found from the activations where static= does not "
                note += "give them (the family's scales, a parallel read of fewer sources), and it reads "
            note += gap or "the same sources and consumers (label, kind, depth, count of sources)"
            found = Suggestion(spec, (note,), type(model).__name__)
            return verify(model, found) if check else found
        guess = _guess(model, forward)
        found = Suggestion(
            guess.spec,
            (f"a guess: the {family.name} family's plan is no spec ({how})", *guess.notes),
            guess.model,
        )
    else:
        found = _guess(model, forward)
    checked = verify(model, found) if check else found
    if check and (found.spec is None or checked.notes[-1].startswith(REFUSED)):
        post = post_ln_spec(model, forward)  # not a sum of its writes: a post-LN model?
        if post is not None:
            how = "found post-LN from what its modules compute: LN(x + write), then LN(. + write) per layer"
            return verify(model, Suggestion(post, (how,), found.model))
    return checked


def post_ln_spec(model: Any, forward: Any = None) -> ModelSpec | None:
    """The spec of a module whose layers compute LN(x + attn), then LN(. + mlp) (``post_ln.find_layout``
    on a probe forward of ids below every embedding table's size), or None where it is not one.
    """
    from depthscope.probes.adapters import post_ln

    tables = [m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    if not tables or min(tables) < 2:
        return None
    try:
        spec = post_ln.find_layout(model, Probe(model, min(tables), forward))
    except DepthscopeError:
        return None
    return dataclasses.replace(spec, forward=forward) if forward is not None else spec


def _guess(model: Any, forward: Any) -> Suggestion:
    name = type(model).__name__
    if not isinstance(model, torch.nn.Module):
        return Suggestion(None, (f"a {name} is not a torch module",), name)
    found = _blocks(model)
    if found is None:
        return Suggestion(
            None, ("no list of layers with sublayers named attn/attention/mlp/... found",), name
        )
    root, layers = found
    inside = lambda p: p == root or p.startswith(root + ".")  # noqa: E731
    embeddings = [p for p, m in model.named_modules() if isinstance(m, torch.nn.Embedding) and not inside(p)]
    vocab = getattr(model.get_submodule(embeddings[0]), "num_embeddings", 0) if embeddings else 0
    order, token, failed = _calls(model, forward, vocab) if vocab >= 2 else ([], None, "no token embedding")
    notes = [f"blocks: {len(layers)} x {type(layers[0]).__name__} at {root!r}"]
    if failed:
        notes.append(f"{failed}: the children are taken in registration order")
    if order:  # the embeddings called, in call order, the one that reads the ids first
        embeddings = sorted((p for p in embeddings if p in order), key=lambda p: (p != token, order.index(p)))
    blocks = [_walk(_units(layer, f"{root}.{i}", order)) for i, layer in enumerate(layers)]
    for _, _, more in blocks[:1]:
        notes += more
    kinds = list(dict.fromkeys(k for w, _, _ in blocks for k in w))
    keys = list(dict.fromkeys(k for _, r, _ in blocks for k in r))
    # a block reading one norm where others read q/k/v views names that norm under each view
    for b, (w, r, more) in enumerate(blocks):
        expanded = {}
        for key, child in r.items():
            views = [k for k in keys if k.startswith(key + ".")] if "." not in key else []
            expanded.update({v: child for v in views} if views else {key: child})
        blocks[b] = (w, expanded, more)
    keys = list(dict.fromkeys(k for _, r, _ in blocks for k in r))
    writes = {k: _pattern(root, [w.get(k) for w, _, _ in blocks]) for k in kinds}
    reads = {k: _pattern(root, [r.get(k) for _, r, _ in blocks]) for k in keys}
    norms = [p for p, m in model.named_modules() if _is_norm(m) and p and not inside(p)]
    called_after = [p for p in order[max((i for i, p in enumerate(order) if inside(p)), default=0) :]]
    readout = next((p for p in reversed(called_after) if p in norms), norms[-1] if norms else None)
    if readout is None:
        notes.append(
            "no final norm outside the blocks: name the read-out (the module reading the last stream)"
        )
    else:
        reads[READOUT] = [readout]
    if not embeddings or not writes:
        notes.append("no embedding module outside the blocks" if not embeddings else "no sublayer found")
        return Suggestion(None, tuple(notes), name)
    spec = ModelSpec(
        embed=embeddings[:2],
        writes={k: v[0] if len(v) == 1 else v for k, v in writes.items()},
        reads={k: v[0] if len(v) == 1 else v for k, v in reads.items()},
        label=name,
        forward=forward,
    )
    return Suggestion(spec, tuple(notes), name)


def verify(model: Any, suggestion: Suggestion) -> Suggestion:
    """The suggestion with a note of what ``build_spec`` makes of it on a probe forward."""
    if suggestion.spec is None:
        return suggestion
    try:
        ad = build_spec(model, suggestion.spec)
    except DepthscopeError as err:
        note = f"{REFUSED}{str(err).removeprefix('ModelSpec: ')}"
    else:
        found = Counter(json.loads(ad.attrs["weights_found"]).values())
        how = ", ".join(f"{k} weights x {n}" for k, n in sorted(found.items()))
        size = f"{len(ad.sources)} sources, {len(ad.consumers)} consumers"
        note = f"checked on a probe forward: read, {size} ({how})"
    return Suggestion(suggestion.spec, (*suggestion.notes, note), suggestion.model)
