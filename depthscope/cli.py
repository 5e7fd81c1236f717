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
out = Console()


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
def demo(
    steps: Annotated[int, typer.Option(help="Training steps per scheme.")] = 40,
    quiet: Annotated[bool, typer.Option(help="No progress bars.")] = False,
) -> None:
    """Train every scheme variant briefly on the default corpus and print a table."""
    from depthscope.corpus import load_corpus
    from depthscope.schemes import ModelConfig, variants
    from depthscope.train import TrainConfig
    from depthscope.train import train as run_train

    corpus = load_corpus()
    table = Table("variant", "scheme", "parameters", "final loss", "val loss", "tokens/s", title=f"{steps} steps each on {corpus.name}")
    for label, scheme, options in variants():
        cfg = ModelConfig(scheme=scheme, n_layers=4, d_model=64, n_heads=4, ctx=64, options=options)
        model = run_train(cfg, TrainConfig(steps=steps, batch_size=8, eval_tokens=4096), corpus, progress=not quiet, label=label)
        s = model.training_summary
        table.add_row(label, scheme, f"{model.n_params():,}", f"{s['final_loss']:.3f}", f"{s['val_loss']:.3f}", f"{s['tokens_per_s']:.0f}")
    out.print(table)


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
