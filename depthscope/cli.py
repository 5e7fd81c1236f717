"""The ``depthscope`` command: thin wrappers that parse, call the pipelines and estimators, and print.

``main(argv)`` returns the exit status (tests call it directly); a user mistake prints one line
``error: ...`` on stderr and returns 2, with no traceback. Option ranges and choices are typer's
own constraints (``Literal`` choices, repeatable options) and the parsers below (``_count`` for
whole numbers, ``_unit``, ``_positive``, ``_path``), reported the same way.
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from depthscope import interrupt
from depthscope.errors import ConfigError, DepthscopeError

if TYPE_CHECKING:
    from depthscope.inputs import ModelRef

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: "--layers N", flags without a type column
    help="Measure how transformers mix earlier layers' outputs across depth.",
)
# user strings (labels, layer names, paths, manifest entries) are printed as they are: no markup,
# no highlighting, so "[/b]" in a label is text, never a rich tag
out = Console(markup=False, highlight=False, **({} if sys.stdout.isatty() else {"width": 160}))
BIG = 2**62  # the most any count may be: torch and numpy count in int64
SEED_MAX = 2**63 - 1  # what both torch.manual_seed and numpy's generators accept (and not negative)
D_MAX = 10_000  # the theory's width: exact risks over every r* < d (the paper: d = 100)


def _show_version(value: bool) -> None:
    if value:
        from depthscope._version import __version__

        out.print(f"depthscope {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_show_version, help="Print the version and exit."),
    ] = False,
) -> None:
    """Measure how transformers mix earlier layers' outputs across depth."""


def _count(low: int, high: int = BIG):
    """A parser for a whole number in [low, high]; its metavar in the help is N. ``high`` is the
    int64 limit torch and numpy count in unless an option has a real one (the theory's width).
    """

    def parse(text: str | int) -> int:
        if isinstance(text, int) and not isinstance(text, bool):  # typer passes the default through
            value = text
        else:
            try:
                value = int(str(text).strip())
            except ValueError:
                raise ValueError(f"{text!r} is not a whole number") from None
        if value < low:
            raise ValueError(f"{value} is less than {low}")
        if value > high:
            raise ValueError(f"{value} is more than {high}")
        return value

    return parse


def _n(help: str, low: int = 1, high: int = BIG, flag: str | None = None, **more: Any) -> Any:
    """A whole-number option in [low, high], shown as N in the help; ``flag`` names it."""
    names = (flag,) if flag else ()
    return typer.Option(*names, parser=_count(low, high), metavar="N", help=help, **more)


def _unit(text: str) -> float:
    """A float in (0, 1]: kappa, energy fractions."""
    value = _float(text)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{value:g} is not in the range 0 < x <= 1")
    return value


def _positive(text: str) -> float:
    value = _float(text)
    if not value > 0.0:
        raise ValueError(f"{value:g} is not in the range x > 0")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if value != value:
        raise ValueError("NaN is not a number here")
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def _path(text: str | Path) -> Path:
    """A file or directory name; an empty one is refused (Path("") would mean the current directory).
    Typer hands an option's default through the parser too, as a Path.
    """
    if not str(text).strip():
        raise ValueError("an empty path")
    return Path(text)


def _output_file(path: Path, *inputs: Path) -> None:
    """Refuse an output file that cannot be written safely before any work starts: a directory, a
    FIFO or device, a name too long, or the input itself.
    """
    from depthscope.atomic import check_output

    try:
        if path.is_dir():
            raise ConfigError(f"--out {path} is a directory; name the file to write")
    except OSError:  # a name the file system refuses: check_output says which
        pass
    check_output(path, *inputs)


def _inputs(
    models: list[Path] | tuple[Path, ...] = (), corpus: Path | None = None, revision: str | None = None
) -> list[ModelRef]:
    """Each model, checkpoint or trace argument parsed once (``inputs.ModelRef``), before anything
    heavy is imported: one that names nothing, or a Hugging Face hub id that is not in the cache
    while the Hub is offline, is refused, and so is a corpus that does not exist. A hub id gets
    ``--revision`` written into it (``ORG/NAME@REVISION``).
    """
    from depthscope.errors import CorpusError
    from depthscope.inputs import ModelRef, check_hub, split_hub

    refs = [ModelRef.of(path) for path in models]
    if revision is not None and not any(ref.kind == "hub" for ref in refs):
        raise ConfigError("--revision applies to Hugging Face hub ids (ORG/NAME), and no model given is one")
    named = []
    for ref in refs:
        if ref.kind == "hub":
            repo, rev = split_hub(ref.text, revision)
            check_hub(repo, rev)
            ref = ModelRef.hub(repo, rev)
        named.append(ref)
    if corpus is not None and not corpus.exists():
        raise CorpusError(f"corpus {corpus} does not exist")
    return named


def _spec_file(path: Path | None, need_spec: bool = True):
    """The spec file named with --spec, run (``probes.specfile``), or None; its spec required to read."""
    if path is None:
        return None
    from depthscope.probes.specfile import read_spec_file

    sf = read_spec_file(path)
    if need_spec:
        sf.require_spec()
    return sf


def _model_inputs(
    models: list[Path], sf, corpus: Path | None = None, revision: str | None = None
) -> list[ModelRef] | list[Path]:
    """``_inputs`` for models, except that what a spec file's load() builds is its own business."""
    if sf is not None and sf.load is not None:
        _inputs([], corpus, revision)
        return list(models)
    return _inputs(models, corpus, revision)


class Variant(str, enum.Enum):
    """GRN variants of the DCA theory."""

    v1 = "v1"
    v2 = "v2"


CorpusOpt = Annotated[
    Path | None,
    typer.Option(parser=_path, help="Text file or directory (default: the Python standard library)."),
]
QuietOpt = Annotated[bool, typer.Option(help="No progress bars.")]
RevisionOpt = Annotated[
    str | None,
    typer.Option(help="Branch, tag or commit of a Hugging Face hub id (the same as ORG/NAME@REVISION)."),
]
TrustOpt = Annotated[
    bool,
    typer.Option(
        "--trust-remote-code",
        help="Load a Hugging Face model that ships its own modeling code (auto_map in config.json): runs "
        "the model's own Python code from its directory.",
    ),
]
SpecOpt = Annotated[
    Path | None,
    typer.Option(
        "--spec",
        parser=_path,
        help="A spec file (FILE.py) for a model no family knows: it defines spec = ModelSpec(...) and "
        "optionally "
        "setup(model) (caches to build before a forward) and load(path) (how to build the model from MODEL). "
        "It is Python: naming it runs its code (depthscope runs only a file named here). `depthscope spec "
        "MODEL` prints one to start from.",
    ),
]
TokenizerOpt = Annotated[
    str | None,
    typer.Option(
        help="How text becomes the model's ids: a Hugging Face tokenizer's directory or hub id (default: "
        "the tokenizer saved with the model; without one, the text's bytes for a 256-id vocabulary). The "
        "trace records which (tokenization).",
    ),
]
CtxOpt = Annotated[
    int | None,
    _n(
        "Window length in tokens (at most the model's context; default: the model's context). Shares "
        "depend on it; for long-context models choose what your question needs (e.g. 256 or 1024): one "
        "window of 8192 tokens costs minutes and gigabytes on a CPU."
    ),
]
SkipOpt = Annotated[
    int | None,
    _n(
        "Leave the first K positions of every window out of every statistic (default: 1 for pretrained "
        "causal LMs, whose first position holds an attention sink; 0 for depthscope's own models).",
        0,
    ),
]


LogitsOpt = Annotated[
    bool, typer.Option(help="Also direct logit attribution per source (checked to add up to the logits).")
]
LensOpt = Annotated[
    bool,
    typer.Option(
        help="Also the logit lens: every consumer's input decoded by the final norm and unembedding (one LM "
        "head product per consumer: about a dozen forwards of a small LM)."
    ),
]
AblateOpt = Annotated[
    Literal["sources", "cells", "off"] | None,
    typer.Option(
        help="Also the loss increase when a source is removed from every later consumer (sources) or from "
        "one consumer (cells): one forward per source or cell."
    ),
]
AblateMeanOpt = Annotated[bool, typer.Option(help="Ablation replaces a term by its token mean instead.")]
AblateTokensOpt = Annotated[
    int | None,
    _n(
        "Ablate only the first batches holding this many tokens (ablation costs a forward per "
        "source or cell); the rest of the trace covers every token."
    ),
]


def _settings(options: dict[str, Any], **fixed: Any):
    """The CaptureSettings of a command's parameters (``options``: its ``locals()`` on entry) that
    are capture options (``pipelines.capture.capture_options``: their names are the keywords of
    ``capture_settings``), with ``fixed`` ones on top: each option is written once, in the command's
    signature, and becomes a setting in one place.
    """
    from depthscope.pipelines.capture import capture_options, capture_settings

    names = capture_options()
    return capture_settings(**{**{k: v for k, v in options.items() if k in names}, **fixed})


def parse_sets(pairs: list[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` -> dict; a malformed pair is a ConfigError."""
    result = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        result[key.strip()] = value.strip()
    return result


@app.command()
def train(
    scheme: Annotated[str, typer.Option(help="Residual scheme (see `depthscope schemes`).")] = "standard",
    out_path: Annotated[
        Path, typer.Option("--out", parser=_path, help="Checkpoint to write (.safetensors).")
    ] = Path("model.safetensors"),
    layers: Annotated[int, _n("Number of blocks.")] = 4,
    d_model: Annotated[int, _n("Width.")] = 64,
    heads: Annotated[int, _n("Attention heads.")] = 4,
    ctx: Annotated[int, _n("Context length in bytes.")] = 128,
    steps: Annotated[
        int,
        _n("Optimiser steps (0 writes the initialised model).", 0),
    ] = 300,
    batch_size: Annotated[int, _n("Sequences per step.")] = 16,
    lr: Annotated[float, typer.Option(parser=_positive, help="Peak learning rate.")] = 3e-3,
    seed: Annotated[
        int,
        _n("Seed for initialisation and batches.", 0, SEED_MAX),
    ] = 0,
    corpus: CorpusOpt = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Scheme option key=value (repeatable).")
    ] = None,
    half: Annotated[bool, typer.Option(help="Store weights in bfloat16 (half the file size).")] = False,
    save_every: Annotated[
        int,
        _n("Also write NAME.step-000500.safetensors every N steps (0: never).", 0),
    ] = 0,
    quiet: QuietOpt = False,
) -> None:
    """Train a byte-level model with one residual scheme and save it as a checkpoint."""
    _output_file(out_path, *([corpus] if corpus else []))
    _inputs(corpus=corpus)
    import torch

    from depthscope.corpus import load_corpus
    from depthscope.schemes import ModelConfig
    from depthscope.schemes.checkpoint import step_checkpoint
    from depthscope.train import TrainConfig
    from depthscope.train import train as run_train

    cfg = ModelConfig(
        scheme=scheme, n_layers=layers, d_model=d_model, n_heads=heads, ctx=ctx, options=parse_sets(set_)
    )
    tcfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    dtype = torch.bfloat16 if half else None

    def snapshot(model, step: int) -> None:
        model.save(step_checkpoint(out_path, step), dtype=dtype)

    snapshots = range(save_every, steps, save_every) if save_every else ()
    model = run_train(
        cfg, tcfg, load_corpus(corpus), progress=not quiet, snapshots=snapshots, on_snapshot=snapshot
    )
    model.save(out_path, dtype=dtype)
    s = model.training_summary
    extra = f"; {len(snapshots)} intermediate checkpoints beside it" if snapshots else ""
    out.print(
        f"wrote {out_path}: {scheme}, {model.n_params():,} parameters, validation loss {s['val_loss']:.4f} "
        f"nats/byte{extra}"
    )


@app.command()
def schemes() -> None:
    """List the residual schemes, their options and named variants."""
    import dataclasses

    from depthscope.schemes import get_scheme, scheme_names

    table = Table("scheme", "paper", "options (--set key=value)", "variants")
    for name in scheme_names():
        cls = get_scheme(name)
        opts = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(cls.Options)) or "-"
        table.add_row(name, cls.paper, opts, ", ".join(cls.variants))
    out.print(table)


@app.command()
def claims(
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir", parser=_path, help="A several-seed zoo directory (default: the bundled seeds)."
        ),
    ] = None,
) -> None:
    """The claims table: each claim of the survey and its papers, ours over seeds, and a verdict."""
    from depthscope.pipelines.claims import read_claims

    c = read_claims(directory)
    table = Table("claim", "source", "paper", "ours (mean ± sd over seeds)", "verdict", title="Claims")
    for r in c.rows:
        table.add_row(r["claim"], r["source"], r["paper"], r["ours"], r["verdict"])
    out.print(table)
    speed = Table("variant", "standard's steps / steps to its final loss", title="Steps to equal loss")
    for r in c.speedups:
        speed.add_row(r["variant"], r["ratio"])
    out.print(speed)
    cost = Table(
        "variant",
        "params",
        "FLOPs/token",
        "time/step",
        "gain (nats/byte)",
        "gain per +1% params",
        "per +1% FLOPs",
        "per +1% time",
        title="Costs against the standard residual, and the gain per unit",
    )
    for r in c.costs:
        cost.add_row(
            *(
                r[k]
                for k in ("variant", "params", "flops", "time", "gain", "per_param", "per_flop", "per_time")
            )
        )
    out.print(cost)
    out.print(c.caveat)


@app.command()
def report(
    inputs: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Checkpoints, traces, model directories, zoo names or Hugging Face hub ids "
            "ORG/NAME[@REVISION] (default: the bundled zoo)."
        ),
    ] = None,
    out_dir: Annotated[
        Path, typer.Option("--out", parser=_path, help="Directory for index.html, traces.nc and the figures.")
    ] = Path("report"),
    corpus: CorpusOpt = None,
    tokens: Annotated[int, _n("Tokens captured per checkpoint.")] = 8192,
    batch_size: Annotated[int, _n("Sequences per forward pass.")] = 16,
    seed: Annotated[int, _n("Seed for the window offsets.", 0, SEED_MAX)] = 0,
    k: Annotated[int, _n("Recent sources counted by the pattern score.", 0)] = 2,
    ctx: CtxOpt = None,
    skip_positions: SkipOpt = None,
    trajectory: Annotated[
        bool,
        typer.Option(help="The checkpoints are steps of one run (default: detected from their metadata)."),
    ] = False,
    steps: Annotated[
        list[int] | None,
        _n(
            "Training step of each checkpoint, in order (repeatable; for checkpoints without one).",
            0,
            flag="--step",
        ),
    ] = None,
    logits: Annotated[
        bool | None,
        typer.Option(
            help="Logit attribution and lens (unset: on for depthscope's own models, cheap there).",
            show_default=False,
        ),
    ] = None,
    ablate: Annotated[
        Literal["sources", "cells", "off"] | None,
        typer.Option(
            help="Ablations for 'Does the weight matter?' (unset: cells on depthscope's own models).",
            show_default=False,
        ),
    ] = None,
    ablate_tokens: AblateTokensOpt = 512,
    revision: RevisionOpt = None,
    trust_remote_code: TrustOpt = False,
    spec: SpecOpt = None,
    tokenizer: TokenizerOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Analyse checkpoints (or traces) into a self-contained HTML report with every figure."""
    options = dict(locals())  # the capture options among them become settings in one place
    sf = _spec_file(spec)
    if sf is not None and not inputs:
        raise ConfigError("--spec reads the models given: name them (the bundled zoo needs no spec)")
    inputs = _model_inputs(inputs or [], sf, corpus, revision)
    from depthscope.pipelines.report import ReportSettings, build_report

    # logits and ablations are chosen per model by ReportSettings ("auto" unless given)
    captured = _settings(options, logits=False, ablate=None)
    settings = ReportSettings(  # unset (None): "auto", chosen per model
        capture=captured,
        k=k,
        corpus=str(corpus) if corpus else None,
        trajectory=trajectory,
        logits="auto" if logits is None else "on" if logits else "off",
        ablate="auto" if ablate is None else ablate,
        trust_remote_code=trust_remote_code,
        spec_file=sf.path if sf is not None else None,
        tokenizer=tokenizer,
    )
    index = build_report(list(inputs or []), out_dir, settings, steps=steps, progress=not quiet)
    out.print(f"wrote {index.resolve()}")


@app.command()
def capture(
    checkpoint: Annotated[
        Path,
        typer.Argument(
            help="A .safetensors checkpoint, a Hugging Face model directory, a .gguf file, smollm2/minilm, a "
            "zoo name (denseformer, deep/hc: `depthscope zoo list`) or a Hugging Face hub id "
            "ORG/NAME[@REVISION]."
        ),
    ],
    out_path: Annotated[Path, typer.Option("--out", parser=_path, help="Trace file to write (netCDF).")],
    corpus: CorpusOpt = None,
    tokens: Annotated[int, _n("Tokens to analyse.")] = 16384,
    batch_size: Annotated[int, _n("Sequences per forward pass.")] = 16,
    seed: Annotated[int, _n("Seed for the window offsets.", 0, SEED_MAX)] = 0,
    ctx: CtxOpt = None,
    skip_positions: SkipOpt = None,
    rank: Annotated[
        bool, typer.Option(help="Also keep each source's output covariance spectrum (for `depthscope rank`).")
    ] = False,
    logits: LogitsOpt = False,
    lens: LensOpt = False,
    ablate: AblateOpt = None,
    ablate_mean: AblateMeanOpt = False,
    ablate_tokens: AblateTokensOpt = None,
    quiet: QuietOpt = False,
    workers: Annotated[
        int,
        _n("Local processes that share the windows (gloo); or run under torchrun."),
    ] = 1,
    checkpoint_every: Annotated[
        int,
        _n("Save the partial sums every N batches beside the output (OUT.partial); 0: never.", 0),
    ] = 0,
    resume: Annotated[
        bool, typer.Option(help="Continue from OUT.partial if it exists (refused if made with other inputs).")
    ] = False,
    device: Annotated[
        str | None, typer.Option(help="Torch device to run the model on (cpu, cuda, cuda:1, mps ...).")
    ] = None,
    dtype: Annotated[
        Literal["float32", "bfloat16", "float16"] | None,
        typer.Option(
            help="Precision the model computes in (statistics stay float64). Default: the checkpoint's."
        ),
    ] = None,
    device_map: Annotated[
        str | None,
        typer.Option(
            help="Hugging Face models: 'auto' (accelerate spreads layers over GPUs, CPU and disk), or a JSON "
            "object or file of module -> device."
        ),
    ] = None,
    revision: RevisionOpt = None,
    trust_remote_code: TrustOpt = False,
    spec: SpecOpt = None,
    tokenizer: TokenizerOpt = None,
) -> None:
    """Capture a trace: what each layer's input is made of, in the delta basis."""
    options = dict(locals())  # the capture options among them become settings in one place
    _output_file(out_path, checkpoint, *([corpus] if corpus else []), *([spec] if spec else []))
    sf = _spec_file(spec)
    [checkpoint] = _model_inputs([checkpoint], sf, corpus, revision)
    from depthscope.pipelines.capture import CaptureJob, run_capture

    settings = _settings(options, ablate=None if ablate == "off" else ablate)
    job = CaptureJob(
        checkpoint,
        out_path,
        corpus,
        settings,
        progress=not quiet,
        workers=workers,
        trust_remote_code=trust_remote_code,
        spec_file=sf.path if sf is not None else None,
        tokenizer=tokenizer,
    )
    trace = run_capture(job)
    if trace is None:  # a rank other than 0 under torchrun: rank 0 reports
        return
    worst = float(trace["residual_error"].max())
    world = int(trace.attrs.get("world_size", 1))
    out.print(
        f"wrote {out_path}: {trace.attrs['label']}, {trace.sizes['layer']} consumers x "
        f"{trace.sizes['source']} sources, "
        f"{trace.attrs['tokens']} tokens in windows of {trace.attrs['ctx']} (max residual error {worst:.1e})"
        + (f", {world} ranks" if world > 1 else "")
    )


def _size(value: str | None) -> tuple[float, float] | None:
    """``W,H`` in inches."""
    if value is None:
        return None
    try:
        w, h = (float(x) for x in value.split(","))
    except ValueError:
        raise typer.BadParameter(f"expected W,H in inches (e.g. 3.5,3), got {value!r}") from None
    if not (0.5 <= w <= 40 and 0.5 <= h <= 40):
        raise typer.BadParameter(f"W and H must be between 0.5 and 40 inches, got {value!r}")
    return w, h


class PlotVar(str, enum.Enum):
    """What ``depthscope plot`` draws (``analysis.select.QUANTITIES``)."""

    weights = "weights"
    mixing = "mixing"
    share = "share"
    departure = "departure"


class PlotScale(str, enum.Enum):
    """The colour scale of ``depthscope plot``."""

    log = "log"
    linear = "linear"
    symlog = "symlog"


@app.command()
def plot(
    trace_path: Annotated[Path, typer.Argument(help="A trace written by `depthscope capture` or `report`.")],
    out_path: Annotated[
        Path, typer.Option("--out", parser=_path, help="The figure: FIG.pdf, FIG.svg or FIG.png.")
    ],
    var: Annotated[
        PlotVar,
        typer.Option(
            help="weights: |M| row-normalised; mixing: M; share: contribution share; departure: share x n_l "
            "(1 = the uniform 1/T share)."
        ),
    ] = PlotVar.weights,
    model: Annotated[
        str | None, typer.Option(help="The model to draw from a stacked trace (its label).")
    ] = None,
    layers: Annotated[
        str | None,
        typer.Option(help="Consumers: labels, kinds, blocks or block ranges (e.g. 'attn,readout' or 0-7)."),
    ] = None,
    sources: Annotated[
        str | None, typer.Option(help="Sources, chosen the same way (e.g. embed,20-29).")
    ] = None,
    blocks: Annotated[
        bool, typer.Option("--blocks", help="Sum each block's sublayers (deep models).")
    ] = False,
    cmap: Annotated[str | None, typer.Option(help="A matplotlib colour map (default: by quantity).")] = None,
    scale: Annotated[
        PlotScale | None, typer.Option(help="Colour scale (default: log for weights, linear otherwise).")
    ] = None,
    size: Annotated[str | None, typer.Option(help="W,H in inches (default: from the cells).")] = None,
    vmin: Annotated[float | None, typer.Option(help="Lowest colour value.")] = None,
    vmax: Annotated[float | None, typer.Option(help="Highest colour value.")] = None,
) -> None:
    """Write one publication figure of a trace: a consumer x source heatmap, its caption printed."""
    from depthscope.pipelines.plot import check_figure_path

    figsize = _size(size)
    check_figure_path(out_path)
    if not trace_path.exists():
        from depthscope.errors import TraceError

        raise TraceError(f"{trace_path}: no such trace file")
    from depthscope.pipelines.plot import plot_trace

    written, caption = plot_trace(
        trace_path,
        out_path,
        var=var.value,
        model=model,
        layers=layers,
        sources=sources,
        blocks=blocks,
        cmap=cmap,
        scale=scale.value if scale else None,
        size=figsize,
        vmin=vmin,
        vmax=vmax,
    )
    out.print(f"wrote {written}")
    out.print(f"caption: {caption}")


@app.command()
def inspect(
    model_path: Annotated[
        Path, typer.Argument(help="A model: checkpoint, directory, zoo name, hub id, smollm2 or minilm.")
    ],
    text: Annotated[str, typer.Option("--text", help="The prompt.")],
    out_path: Annotated[
        Path,
        typer.Option("--out", parser=_path, help="FIG.pdf/.svg/.png, or T.nc for the per-position table."),
    ],
    position: Annotated[int | None, typer.Option(help="The position to draw (default: the last).")] = None,
    layer: Annotated[
        str | None, typer.Option(help="Draw this consumer's sources along the prompt instead.")
    ] = None,
    var: Annotated[str, typer.Option(help="share (contribution share) or mixing (the weights M).")] = "share",
    trust_remote_code: TrustOpt = False,
    spec: SpecOpt = None,
    tokenizer: TokenizerOpt = None,
) -> None:
    """One prompt, position by position: where each token's inputs come from."""
    from depthscope.pipelines.plot import check_figure_path

    if out_path.suffix.lower() != ".nc":
        check_figure_path(out_path)
    sf = _spec_file(spec)
    [model] = _model_inputs([model_path], sf)
    from depthscope.pipelines.plot import inspect_prompt

    reading = {"spec_file": sf, "trust_remote_code": trust_remote_code, "tokenizer": tokenizer}
    written, what = inspect_prompt(model, text, out_path, position=position, layer=layer, var=var, **reading)
    out.print(f"wrote {written}: {what}")


@app.command("spec")
def spec_(
    model_path: Annotated[
        Path,
        typer.Argument(
            help="A model: a Hugging Face directory, a torch.save file, a hub id ... (or what --spec loads)."
        ),
    ],
    out_path: Annotated[
        Path | None, typer.Option("--out", parser=_path, help="Write the spec file here (default: print it).")
    ] = None,
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            parser=_path,
            help="A spec file whose load(path) and setup(model) build and prepare the model (its spec, if "
            "any, is not used). It is Python: naming it runs its code.",
        ),
    ] = None,
    trust_remote_code: TrustOpt = False,
) -> None:
    """Print a ModelSpec to start from, in the model's own module names: a spec file to edit for --spec."""
    if out_path is not None:
        _output_file(out_path, model_path, *([spec] if spec else []))
    sf = _spec_file(spec, need_spec=False)
    [model] = _model_inputs([model_path], sf)
    from depthscope.pipelines.capture import suggest

    text = suggest(model, sf.path if sf else None, trust_remote_code=trust_remote_code)
    if out_path is None:
        out.print(text, end="", soft_wrap=True)
        return
    from depthscope.atomic import atomic_path

    with atomic_path(out_path) as tmp:
        tmp.write_text(text)
    out.print(
        f"wrote {out_path}: a ModelSpec to edit, then `depthscope capture {model_path} --spec {out_path}`"
    )


@app.command()
def dilution(
    trace_path: Annotated[Path, typer.Argument(help="A trace written by `depthscope capture` or `report`.")],
    k: Annotated[int, _n("Recent sources counted by the pattern score.", 0)] = 2,
    layer: Annotated[
        str | None,
        typer.Option(help="Show one consumer's sources instead of the table (e.g. readout, 12.attn)."),
    ] = None,
    readout: Annotated[
        bool, typer.Option("--readout", help="The read-out's sources (--layer readout).")
    ] = False,
) -> None:
    """How diluted each write is against the 1/T baseline: what it comes to, then per consumer (or
    one consumer's sources).
    """
    if not trace_path.exists():
        from depthscope.errors import TraceError

        raise TraceError(f"{trace_path}: no such trace file")
    from depthscope.inputs import input_kind
    from depthscope.trace import load_trace, split_models

    if input_kind(trace_path) != "trace":
        raise ConfigError(
            f"{trace_path}: a model, not a trace: capture it first "
            f"(depthscope capture {trace_path} --out t.nc)"
        )
    for t in split_models(load_trace(trace_path)):
        _dilution_findings(t, k)
        one = "readout" if readout else layer
        if one is not None:
            _dilution_sources(t, one)
        else:
            _dilution_table(t, k)


def _dilution_findings(t, k: int) -> None:
    """The conclusion first: the read-out's writes against 1/T, the embedding, the pattern."""
    from depthscope.analysis.dilution import findings, summary, unit_weights

    f = findings(t)
    title = t.attrs.get("label", t.attrs.get("scheme", ""))
    n, tokens = f["n_sources"], t.attrs.get("tokens", "?")
    where = "the read-out" if f["layer"] == "readout" else f["layer"]
    out.print(f"{title}: {t.sizes['layer']} consumers x {t.sizes['source']} sources, {tokens} tokens")
    out.print(
        f"  at {where} ({n} sources, uniform share 1/{n} = {1 / n:.4f} each): {f['below']} of "
        f"{f['writes']} sublayer writes are below it ({f['negative']} negative: pulling against the rest); "
        f"most diluted {f['most_diluted']} (index {_fmt(f['most_diluted_index'], 4)}: its share over 1/{n}), "
        f"least {f['least_diluted']} (index {_fmt(f['least_diluted_index'], 2)})"
    )
    k_e = f["embed_sources"]
    out.print(
        f"  the embedding ({k_e} source{'s' if k_e != 1 else ''}) holds {_fmt(f['embed_share'], 4)} of "
        f"{where}: index {_fmt(f['embed_index'], 3)} against its uniform share {k_e}/{n}"
    )
    out.print(
        f"  residual norm growth {_fmt(f['norm_growth_ratio'], 2)}x: the RMS of the last sublayer input "
        f"({f['norm_growth_to'] or '-'}) over the first's ({f['norm_growth_from'] or '-'}); the indices "
        "measure shares of an input, this how much the stream's magnitude grew"
    )
    s = summary(t, k)
    ps = s["pattern_score"]
    if unit_weights(t):
        out.print("  pattern score: 1 by construction (unit weights: every source is read with weight 1)")
    else:
        ssm = f", SSM {_fmt(ps.sel(group='ssm'))}" if bool((t["layer_kind"] == "ssm").any()) else ""
        out.print(
            f"  pattern score (k={k}): sublayer inputs {_fmt(ps.sel(group='sublayers'))} (attention "
            f"{_fmt(ps.sel(group='attn'))}, MLP {_fmt(ps.sel(group='mlp'))}{ssm}), read-out "
            f"{_fmt(ps.sel(group='readout'))}; 1 = uniform, above 1 the input-and-recent pattern"
        )
    out.print(f"  max residual error {float(s['max_residual_error']):.1e}")


def _dilution_sources(t, layer: str) -> None:
    from depthscope.analysis.dilution import sources_at

    labels = [str(x) for x in t["layer"].values]
    if layer not in labels:
        raise ConfigError(f"no consumer {layer!r} in this trace (e.g. {', '.join(labels[:3])}, readout)")
    view = sources_at(t, layer)
    n = view.attrs["n_sources"]
    rows = Table("source", "share", f"index (share x {n})", "weight M", title=f"{layer}: its {n} sources")
    for s in view["source"].values:
        r = view.sel(source=s)
        rows.add_row(str(s), _fmt(r["share"], 4), _fmt(r["index"], 3), _fmt(r["weight"], 3))
    out.print(rows)


def _dilution_table(t, k: int) -> None:
    from depthscope.analysis.dilution import consumer_table

    table = consumer_table(t, k)
    rows = Table(
        "consumer",
        "sources",
        "1/T",
        "embed share",
        "latest share",
        "embed index",
        "latest index",
        f"pattern (k={k})",
        title="per consumer, against the 1/T baseline (embed: the embedding group; latest: the latest "
        "sublayer)",
    )
    for i in range(table.sizes["layer"]):
        r = table.isel(layer=i)
        rows.add_row(
            str(r["layer"].item()),
            str(int(r["n_sources"])),
            _fmt(r["baseline"]),
            _fmt(r["embed_share"]),
            _fmt(r["latest_share"]),
            _fmt(r["embed_index"], 2),
            _fmt(r["latest_index"], 2),
            _fmt(r["pattern_score"], 2),
        )
    out.print(rows)


@app.command()
def adapters() -> None:
    """List the model families depthscope reads: what each reads, the package version it was written for."""
    from depthscope.probes.adapters import describe

    table = Table("family", "reads", "package", "written for", "installed")
    for row in describe():
        flag = "" if row["installed"] == row["written_for"] or row["package"] == "-" else " (differs)"
        table.add_row(
            row["family"], row["reads"], row["package"], row["written_for"], row["installed"] + flag
        )
    out.print(table)


zoo_app = typer.Typer(no_args_is_help=True, help="The bundled zoo of small trained checkpoints.")
app.add_typer(zoo_app, name="zoo")


@zoo_app.command("list")
def zoo_list(
    directory: Annotated[
        Path | None,
        typer.Option("--dir", parser=_path, help="A zoo directory (default: every bundled collection)."),
    ] = None,
    collection: Annotated[
        str | None,
        typer.Option(
            help="One bundled collection: 'zoo' (8 blocks), 'deep' (16 blocks) or 'seeds' (3 seeds, 1000 "
            "steps); default: all."
        ),
    ] = None,
) -> None:
    """Print the zoo manifests: scheme, size, training and validation loss of each checkpoint.

    The names printed are model arguments: `depthscope capture denseformer`, `depthscope capture deep/hc`.
    """
    from depthscope import zoo

    if directory is not None and collection is not None:
        raise ConfigError("give --dir or --collection, not both")
    if directory is not None:
        shown = [(directory, "")]
    else:
        colls = [zoo.collection(collection)] if collection is not None else list(zoo.COLLECTIONS.values())
        shown = [(c.directory, "" if c is zoo.ZOO else f"{c.name}/") for c in colls]  # as capture takes it
    for where, prefix in shown:
        if directory is None and collection is None and not (where / zoo.MANIFEST).is_file():
            out.print(
                f"{prefix.rstrip('/')}: not built (`depthscope zoo build --collection {prefix.rstrip('/')}`)"
            )
            continue
        entries = zoo.read_manifest(where)
        _zoo_table(entries, prefix, title=f"{prefix.rstrip('/') or 'zoo'}: {where}")
        out.print(f"corpus: {entries[0]['corpus'] if entries else '-'}")


def _zoo_table(entries: list[dict], prefix: str, title: str) -> None:
    table = Table(
        "name",
        "scheme",
        "options",
        "blocks x d_model",
        "params",
        "steps",
        "seed",
        "val loss (nats/byte)",
        "file",
        "KB",
        "trajectory",
        title=title,
    )
    for k in (0, 8):  # a name or file is typed as it is printed: never cut (folded where too long)
        table.columns[k].overflow = "fold"
        table.columns[k].min_width = min(
            40,
            max((len(prefix + m["name"]) if k == 0 else len(m["file"] or "-")) for m in entries)
            if entries
            else 4,
        )
    for m in entries:
        c = m["config"]
        opts = ", ".join(f"{k}={v}" for k, v in c["options"].items()) or "-"
        traj = ", ".join(map(str, m["trajectory"]["steps"])) if m.get("trajectory") else "-"
        table.add_row(
            prefix + m["name"],
            m["scheme"],
            opts,
            f"{c['n_layers']} x {c['d_model']}",
            f"{m['params']:,}",
            str(m["steps"]),
            str(m["seed"]),
            f"{m['val_loss']:.3f}",
            m["file"] or "- (trace only)",
            f"{m['bytes'] / 1024:.0f}",
            traj,
        )
    out.print(table)


@zoo_app.command("build")
def zoo_build(
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", parser=_path, help="Where to write (default: the bundled zoo directory)."),
    ] = None,
    steps: Annotated[
        int | None,
        _n("Training steps per model (default: the zoo's)."),
    ] = None,
    only: Annotated[
        list[str] | None,
        typer.Option(help="Entry or run (e.g. dca, dca.seed1) to build (repeatable; default: all)."),
    ] = None,
    recapture: Annotated[
        bool, typer.Option(help="Capture the trajectories again from their step checkpoints.")
    ] = False,
    collection: Annotated[
        str,
        typer.Option(
            help="Which zoo: 'zoo' (8 blocks), 'deep' (16 blocks, dilution versus depth) or 'seeds' "
            "(3 seeds, 1000 steps, validation loss every 100 steps, grown baselines)."
        ),
    ] = "zoo",
    quiet: QuietOpt = False,
) -> None:
    """Train the zoo reproducibly (fixed seeds, default corpus; hours on 2 cores), skipping up-to-date models.

    Incremental and resumable: a model whose checkpoint matches its manifest entry is skipped, so
    an interrupted build continues where it stopped. Two builds of one collection may run at once
    (one per core, different --only): each merges its runs into the manifest.
    """
    from depthscope import zoo
    from depthscope.pipelines.zoo import build

    coll = zoo.collection(collection)
    entries = build(
        out_dir,
        collection=coll,
        steps=steps,
        only=only,
        recapture=recapture,
        progress=not quiet,
        log=out.print,
    )
    out.print(f"{len(entries)} zoo entries in {out_dir or coll.directory}")


class _RankGroup(typer.core.TyperGroup):
    """`depthscope rank PATH` measures a checkpoint or trace; the other words are subcommands."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            return "measure", self.commands["measure"], args
        return super().resolve_command(ctx, args)

    def list_commands(self, ctx):
        return [c for c in super().list_commands(ctx) if c != "measure"]


rank_app = typer.Typer(
    cls=_RankGroup,
    no_args_is_help=True,
    help="Collective rank versus width (DCA, arXiv 2502.06785 Sec. 4): `rank CKPT_OR_TRACE`, "
    "`rank threshold`, `rank theory`, `rank identity`, `rank sweep`.",
)
app.add_typer(rank_app, name="rank")


def _emit_json(obj) -> None:
    import json

    from depthscope.pipelines.files import json_default

    print(json.dumps(obj, indent=1, default=json_default))


@rank_app.command("measure", hidden=True)
def rank_measure(
    path: Annotated[
        Path,
        typer.Argument(
            help="A checkpoint, a model directory, a zoo name, a Hugging Face hub id ORG/NAME[@REVISION], or "
            "a trace captured with --rank."
        ),
    ],
    kappa: Annotated[
        float | None,
        typer.Option(
            parser=_unit, help="Task complexity lambda_min/lambda_max in (0, 1] to compare r*/d against."
        ),
    ] = None,
    variant: Annotated[Variant, typer.Option(help="GRN variant of the threshold.")] = Variant.v1,
    tokens: Annotated[int, _n("Tokens captured from a checkpoint.")] = 16384,
    energy: Annotated[
        float, typer.Option(parser=_unit, help="Energy fraction of the numerical rank, in (0, 1].")
    ] = 0.99,
    corpus: CorpusOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False,
    revision: RevisionOpt = None,
    trust_remote_code: TrustOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Effective rank of each sublayer's outputs, r*, d and r*/d against the DCA threshold."""
    options = dict(locals())
    [path] = _inputs([path], corpus, revision)
    from depthscope.pipelines.rank import measure

    results = measure(
        path,
        _settings(options, rank=True),
        corpus,
        energy,
        kappa,
        variant.value,
        progress=not quiet and not as_json,
        trust_remote_code=trust_remote_code,
    )
    if as_json:
        _emit_json(results[0] if len(results) == 1 else results)
        return
    for res in results:
        table = Table(
            "source",
            "numerical",
            "entropy",
            "participation",
            title=f"{res['label']}: effective ranks of outputs over {res['tokens']} tokens (d = {res['d']})",
        )
        for row in res["sources"]:
            table.add_row(
                row["source"],
                f"{row['numerical']:.0f}",
                f"{row['entropy']:.1f}",
                f"{row['participation']:.1f}",
            )
        out.print(table)
        for kind in ("numerical", "entropy", "participation"):
            out.print(
                f"r* ({kind}) = {res['collective_rank'][kind]:.1f} over {res['n_layers_counted']} "
                f"sublayers; r*/d = {res['ratio'][kind]:.3f}"
            )
        if "ratio_half" in res:
            out.print(
                f"convergence: r*/d (numerical) = {res['ratio_half']:.3f} from half the tokens "
                f"({res['tokens_half']}), {res['ratio']['numerical']:.3f} from all {res['tokens']}"
            )
        if kappa is not None:
            bound = "none" if res["derived_bound"] is None else f"{res['derived_bound']:.3f}"
            won = (
                f"wins at every r*/d scanned (1/{res['d']} to {res['d'] - 1}/{res['d']})"
                if res["at_edge"]
                else f"wins up to r*/d = {res['threshold']:.3f}"
            )
            out.print(
                f"kappa = {kappa}: GRN-{variant.value} {won} (exact risks); derived sufficient bound {bound}"
            )
        out.print(res["conclusion"])


@rank_app.command("threshold")
def rank_threshold(
    d: Annotated[int, _n("Width d.", 2, D_MAX)],
    kappa: Annotated[
        float, typer.Option(parser=_unit, help="Task complexity lambda_min / lambda_max, in (0, 1].")
    ],
    variant: Annotated[Variant, typer.Option(help="GRN variant.")] = Variant.v1,
    tasks: Annotated[int, _n("Random tasks averaged.")] = 8,
    seed: Annotated[int, _n("Seed of the random tasks.", 0, SEED_MAX)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Largest r*/d at which a GRN beats the ResNet at equal parameters (exact risks)."""
    from depthscope.analysis.theory import derived_bound, threshold

    num = threshold(d, kappa, variant.value, n_tasks=tasks, seed=seed)
    bound = derived_bound(kappa, variant.value, d=d)
    res = {
        "d": d,
        "kappa": kappa,
        "variant": variant.value,
        "threshold": num,
        "derived_bound": None if bound is None else float(bound),
    }
    if as_json:
        _emit_json(res)
        return
    won = f"at every r*/d scanned (1/{d} to {d - 1}/{d})" if num >= (d - 1) / d else f"up to r*/d = {num:.3f}"
    out.print(
        f"GRN-{variant.value}, d = {d}, kappa = {kappa}: wins at equal parameters {won} "
        f"(exact risks, mean of {tasks} tasks)"
    )
    out.print(
        "derived here (sufficient condition, not the paper's printed bound): r*/d < "
        f"{res['derived_bound']:.3f}"
        if bound is not None
        else "no closed form for this variant"
    )


@rank_app.command("theory")
def rank_theory(
    out_dir: Annotated[
        Path, typer.Option("--out", parser=_path, help="Directory for theory.json and the figures.")
    ],
    variants: Annotated[
        list[Variant] | None,
        typer.Option("--variant", help="GRN variant (repeatable; default v1 and v2; v2 takes minutes)."),
    ] = None,
    tasks: Annotated[int, _n("Random tasks averaged per point.")] = 2,
    seed: Annotated[int, _n("Seed of the random tasks.", 0, SEED_MAX)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print theory.json.")] = False,
) -> None:
    """DCA's Fig. 5 with exact risks: gain versus r* and lambda_min, and the threshold versus kappa."""
    from depthscope.pipelines.theory import run

    doc = run(out_dir, tuple(dict.fromkeys(v.value for v in variants or list(Variant))), tasks, seed)
    if as_json:
        _emit_json(doc)
        return
    for t in doc["threshold_vs_kappa"]:
        out.print(
            f"GRN-{t['variant']} threshold r*/d at d = 100 for kappa "
            + ", ".join(f"{k:.2f}: {v:.2f}" for k, v in zip(t["kappa"], t["threshold"]))
        )
    out.print(
        f"wrote {out_dir / 'theory.json'} and gain-vs-rank, gain-vs-lambda, threshold-vs-kappa (.png, .svg)"
    )


@rank_app.command("identity")
def rank_identity(
    out_dir: Annotated[
        Path, typer.Option("--out", parser=_path, help="Directory for identity.json and the figures.")
    ],
    steps: Annotated[int, _n("SGD steps (the paper: 1000).")] = 1000,
    sweep: Annotated[
        bool, typer.Option(help="Also run the width sweep d in {40, 60, 100, 200, 400}.")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print identity.json's summary as JSON.")] = False,
) -> None:
    """DCA's Fig. 1: a ResNet of 10 rank-3 linear layers versus GRN-v1 on the identity and a random map."""
    from depthscope.pipelines.identity import IdentitySettings, run

    doc = run(out_dir, IdentitySettings(steps=steps), sweep=sweep)
    if as_json:
        _emit_json({"settings": doc["settings"], "summary": doc["summary"]})
        return
    for task in ("identity", "random"):
        s = doc["summary"][task]
        out.print(
            f"{task}: final MSE ResNet {s['final']['resnet']:.3g}, GRN-v1 {s['final']['grn_v1']:.3g}; "
            f"GRN-v1 reaches the ResNet's final error at step {s['grn_v1_steps_to_resnet_final']}"
        )
    out.print(f"wrote {out_dir / 'identity.json'} and the figures (.png, .svg)")


@rank_app.command("sweep")
def rank_sweep_cmd(
    out_dir: Annotated[
        Path, typer.Option("--out", parser=_path, help="Directory for sweep.nc, sweep.json and the figure.")
    ],
    widths: Annotated[
        list[int] | None,
        _n("Width (repeatable; multiples of 16; default 32, 64, 128).", 32, flag="--width"),
    ] = None,
    schemes: Annotated[
        list[str] | None,
        typer.Option("--scheme", help="Scheme to train (repeatable; default standard and dca)."),
    ] = None,
    layers: Annotated[int, _n("Blocks per model.")] = 4,
    steps: Annotated[int, _n("Training steps per model.")] = 300,
    tokens: Annotated[int, _n("Tokens captured per model.")] = 8192,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Train small models at several widths on the default corpus and plot r*/d against width."""
    from depthscope.pipelines.rank import run_sweep
    from depthscope.schemes import get_scheme

    ws = list(dict.fromkeys(widths or [32, 64, 128]))
    names = tuple(dict.fromkeys(schemes or ["standard", "dca"]))
    for name in names:
        get_scheme(name)
    if any(w % 16 for w in ws):
        raise ConfigError(
            f"widths must be multiples of 16 (heads of 16), got {', '.join(str(w) for w in ws if w % 16)}"
        )
    doc = run_sweep(out_dir, ws, names, n_layers=layers, steps=steps, tokens=tokens, progress=not quiet)
    if as_json:
        _emit_json(doc)
        return
    for s in names:
        out.print(f"{s}: r*/d (numerical) at d = {ws}: " + ", ".join(f"{v:.3f}" for v in doc["ratio"][s]))
    out.print(f"wrote {out_dir / 'sweep.nc'}, sweep.json and rank-vs-width (.png, .svg)")


def _fmt(x, digits: int = 3) -> str:
    v = float(x)
    return "-" if v != v else f"{v:.{digits}f}"


_METAVARS = {"Path": "PATH", "str": "TEXT", "float": "X", "int": "N"}


def _plain_metavars(command) -> None:
    """Name every option's value the way command-line help does (PATH, TEXT, X, N, {a|b}) instead
    of the Python type in angle brackets that typer would print, and leave flags without one.
    """
    for param in getattr(command, "params", []):
        kind = getattr(param, "param_type_name", "")
        if kind == "argument" and param.metavar is None:  # the name alone; its help says what it takes
            param.metavar = param.name.upper().removesuffix("_PATH")
            param.display_type_rich = lambda ctx: None
        if kind != "option" or param.is_flag or param.metavar is not None:
            continue
        shown = (param.display_type(None) or "").strip("<>")
        inner = shown[5:-1] if shown.startswith("list[") else shown
        param.metavar = _METAVARS.get(inner, "{" + inner + "}" if "|" in inner else inner.upper())
    for sub in getattr(command, "commands", {}).values():
        _plain_metavars(sub)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (2 for a user mistake, with one line on stderr)."""
    err = Console(stderr=True, markup=False, highlight=False)
    try:
        command = typer.main.get_command(app)
        _plain_metavars(command)
        status = command(args=argv, prog_name="depthscope", standalone_mode=False)
    except DepthscopeError as e:
        err.print(
            Text.assemble(("error:", "red"), " ", " ".join(str(e).split())), highlight=False, soft_wrap=True
        )
        return 2
    except typer.Exit as e:  # --help, or an explicit exit
        return e.exit_code
    except (typer.Abort, KeyboardInterrupt):
        interrupt.say()
        return 130
    except OSError as e:  # the system refused: a full disk, a lost permission, a name too long
        where = f" writing {e.filename}" if getattr(e, "filename", None) else ""
        line = f"{e.strerror or e}{where}"
        err.print(Text.assemble(("error:", "red"), " ", line), highlight=False, soft_wrap=True)
        return 2
    except typer.TyperException as e:  # usage errors: unknown option, bad value ...
        message = " ".join(e.format_message().split()).replace("Value error, ", "")
        message = message or "no command given (the commands are listed above)"
        err.print(
            Text.assemble(("error:", "red"), " ", message),
            highlight=False,
            soft_wrap=True,
        )
        return 2
    if status == 130:  # typer turns Ctrl-C inside a command into a returned 130
        interrupt.say()
        return 130
    return status if isinstance(status, int) else 0
