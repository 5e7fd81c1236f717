"""The ``depthscope`` command: thin wrappers that parse, call the rooms, and print.

``main(argv)`` returns the exit status (tests call it directly); a user mistake prints one line
``error: ...`` on stderr and returns 2, with no traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from depthscope.errors import ConfigError, DepthscopeError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Measure how transformers mix earlier layers' outputs across depth.",
)
out = Console() if sys.stdout.isatty() else Console(width=160)


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
    out_path: Annotated[Path, typer.Option("--out", help="Checkpoint to write (.safetensors).")] = Path("model.safetensors"),
    layers: Annotated[int, typer.Option(help="Number of blocks.")] = 4,
    d_model: Annotated[int, typer.Option(help="Width.")] = 64,
    heads: Annotated[int, typer.Option(help="Attention heads.")] = 4,
    ctx: Annotated[int, typer.Option(help="Context length in bytes.")] = 128,
    steps: Annotated[int, typer.Option(help="Optimiser steps (0 writes the initialised model).")] = 300,
    batch_size: Annotated[int, typer.Option(help="Sequences per step.")] = 16,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 3e-3,
    seed: Annotated[int, typer.Option(help="Seed for initialisation and batches.")] = 0,
    corpus: Annotated[Optional[Path], typer.Option(help="Text file or directory (default: the Python standard library).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Scheme option key=value (repeatable).")] = None,
    half: Annotated[bool, typer.Option(help="Store weights in bfloat16 (half the file size).")] = False,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
) -> None:
    """Train a byte-level model with one residual scheme and save it as a checkpoint."""
    import torch

    from depthscope.corpus import load_corpus
    from depthscope.schemes import ModelConfig
    from depthscope.train import TrainConfig
    from depthscope.train import train as run_train

    cfg = ModelConfig(scheme=scheme, n_layers=layers, d_model=d_model, n_heads=heads, ctx=ctx, options=parse_sets(set_))
    tcfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    model = run_train(cfg, tcfg, load_corpus(corpus), progress=not quiet)
    model.save(out_path, dtype=torch.bfloat16 if half else None)
    s = model.training_summary
    out.print(f"wrote {out_path}: {scheme}, {model.n_params():,} parameters, validation loss {s['val_loss']:.4f} nats/byte")


@app.command()
def schemes() -> None:
    """List the residual schemes, their options and named variants."""
    import dataclasses

    from depthscope.schemes import get_scheme, scheme_names

    table = Table("scheme", "paper", "options (--set key=value)", "variants")
    for name in scheme_names():
        cls = get_scheme(name)
        opts = ", ".join(f"{f.name}={f.default}" for f in dataclasses.fields(cls.Options)) or "-"
        table.add_row(name, cls.paper, opts, ", ".join(cls.variants or [name]))
    out.print(table)


@app.command()
def report(
    inputs: Annotated[Optional[list[Path]], typer.Argument(help="Checkpoints, traces or model directories (default: the bundled zoo).")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for index.html, traces.nc and the figures.")] = Path("report"),
    corpus: Annotated[Optional[Path], typer.Option(help="Text file or directory (default: the Python standard library).")] = None,
    tokens: Annotated[int, typer.Option(help="Tokens captured per checkpoint.")] = 8192,
    batch_size: Annotated[int, typer.Option(help="Sequences per forward pass.")] = 16,
    seed: Annotated[int, typer.Option(help="Seed for the window offsets.")] = 0,
    k: Annotated[int, typer.Option(help="Recent sources counted by the pattern score.")] = 2,
    quiet: Annotated[bool, typer.Option(help="No progress bars.")] = False,
) -> None:
    """Analyse checkpoints (or traces) into a self-contained HTML report with every figure."""
    from depthscope.figures.report import ReportSettings, build_report

    if k < 0 or batch_size < 1 or tokens < 1:
        raise ConfigError("k must be >= 0, and batch size and tokens >= 1")
    settings = ReportSettings(tokens=tokens, batch_size=batch_size, seed=seed, k=k, corpus=str(corpus) if corpus else None)
    index = build_report(list(inputs or []), out_dir, settings, progress=not quiet)
    out.print(f"report written: {index.resolve()}")


@app.command()
def capture(
    checkpoint: Annotated[Path, typer.Argument(help="A .safetensors checkpoint or a local Hugging Face model directory.")],
    out_path: Annotated[Path, typer.Option("--out", help="Trace file to write (netCDF).")],
    corpus: Annotated[Optional[Path], typer.Option(help="Text file or directory (default: the Python standard library).")] = None,
    tokens: Annotated[int, typer.Option(help="Tokens to analyse.")] = 16384,
    batch_size: Annotated[int, typer.Option(help="Sequences per forward pass.")] = 16,
    seed: Annotated[int, typer.Option(help="Seed for the window offsets.")] = 0,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
) -> None:
    """Capture a trace: what each layer's input is made of, in the delta basis."""
    from depthscope.probes import capture as run_capture
    from depthscope.probes import save_trace
    from depthscope.probes.bridge import load_model

    if batch_size < 1:
        raise ConfigError(f"batch size must be >= 1, got {batch_size}")
    model = load_model(str(checkpoint))
    trace = run_capture(model, corpus, n_tokens=tokens, batch_size=batch_size, seed=seed, progress=not quiet, checkpoint=str(checkpoint))
    save_trace(trace, out_path)
    worst = float(trace["residual_error"].max())
    out.print(f"wrote {out_path}: {trace.attrs['label']}, {trace.sizes['layer']} consumers x {trace.sizes['source']} sources, {trace.attrs['tokens']} tokens (max residual error {worst:.1e})")


@app.command()
def dilution(
    trace_path: Annotated[Path, typer.Argument(help="A trace written by `depthscope capture` or `report`.")],
    k: Annotated[int, typer.Option(help="Recent sources counted by the pattern score.")] = 2,
) -> None:
    """Print the dilution table of a trace: shares against the 1/T baseline, per consumer."""
    from depthscope.analysis.dilution import consumer_table, summary
    from depthscope.probes import load_trace
    from depthscope.probes.trace import select_scheme

    if k < 0:
        raise ConfigError(f"k must be >= 0, got {k}")
    trace = load_trace(trace_path)
    stacked = "scheme" in trace.dims
    for t in [select_scheme(trace, s) for s in trace["scheme"].values] if stacked else [trace]:
        table = consumer_table(t, k)
        title = t.attrs.get("label", t.attrs.get("scheme", ""))
        rows = Table(
            "consumer", "sources", "1/T", "embed share", "latest share", "embed index", "latest index", f"pattern (k={k})",
            title=f"{title}: dilution against the 1/T baseline ({t.attrs.get('tokens', '?')} tokens)",
        )
        for i in range(table.sizes["layer"]):
            r = table.isel(layer=i)
            rows.add_row(
                str(r["layer"].item()), str(int(r["n_sources"])), _fmt(r["baseline"]), _fmt(r["embed_share"]),
                _fmt(r["latest_share"]), _fmt(r["embed_index"], 2), _fmt(r["latest_index"], 2), _fmt(r["pattern_score"], 2),
            )
        out.print(rows)
        s = summary(t, k)
        out.print(
            f"mean pattern score {_fmt(s['pattern_score'], 3)}; read-out: embedding share {_fmt(s['readout_embed_share'])}, "
            f"latest share {_fmt(s['readout_latest_share'])}; max residual error {float(s['max_residual_error']):.1e}"
        )


zoo_app = typer.Typer(no_args_is_help=True, help="The bundled zoo of small trained checkpoints.")
app.add_typer(zoo_app, name="zoo")


@zoo_app.command("list")
def zoo_list(
    directory: Annotated[Optional[Path], typer.Option("--dir", help="A zoo directory (default: the bundled zoo).")] = None,
) -> None:
    """Print the zoo manifest: scheme, size, training and validation loss of each checkpoint."""
    from depthscope import zoo

    entries = zoo.read_manifest(directory or zoo.ZOO_DIR)
    table = Table("name", "scheme", "options", "blocks x d_model", "params", "steps", "seed", "val loss (nats/byte)", "file", "KB")
    for m in entries:
        c = m["config"]
        opts = ", ".join(f"{k}={v}" for k, v in c["options"].items()) or "-"
        table.add_row(
            m["name"], m["scheme"], opts, f"{c['n_layers']} x {c['d_model']}", f"{m['params']:,}", str(m["steps"]),
            str(m["seed"]), f"{m['val_loss']:.3f}", m["file"], f"{m['bytes'] / 1024:.0f}",
        )
    out.print(table)
    out.print(f"corpus: {entries[0]['corpus'] if entries else '-'}")


@zoo_app.command("build")
def zoo_build(
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="Where to write (default: the bundled zoo directory).")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Training steps per model (default: the zoo's).")] = None,
    only: Annotated[Optional[str], typer.Option(help="Comma-separated entry names to rebuild.")] = None,
    quiet: Annotated[bool, typer.Option(help="No progress bars.")] = False,
) -> None:
    """Retrain the zoo reproducibly (fixed seeds, default corpus; tens of minutes on 2 cores)."""
    from depthscope import zoo

    names = [n.strip() for n in only.split(",") if n.strip()] if only else None
    entries = zoo.build(out_dir or zoo.ZOO_DIR, steps=zoo.STEPS if steps is None else steps, only=names, progress=not quiet)
    out.print(f"wrote {len(entries)} zoo entries to {out_dir or zoo.ZOO_DIR}")


def _fmt(x, digits: int = 3) -> str:
    v = float(x)
    return "-" if v != v else f"{v:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (2 for a user mistake, with one line on stderr)."""
    err = Console(stderr=True)
    try:
        app(args=argv, prog_name="depthscope", standalone_mode=False)
    except DepthscopeError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        return 2
    except typer.Exit as e:  # --help, or an explicit exit
        return e.exit_code
    except typer.Abort:
        err.print("aborted")
        return 130
    except typer.TyperException as e:  # usage errors: unknown option, bad value ...
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
        return 2
    return 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
