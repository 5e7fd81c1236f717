"""``depthscope rank``: measure r*/d of a checkpoint or trace, and ``rank sweep``: train small
models at several widths and measure r*/d of each.

The training and capture are orchestration; the ranks come from ``depthscope.analysis.rank``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from depthscope.analysis.rank import KINDS, collective_rank, rank_summary
from depthscope.atomic import atomic_path
from depthscope.corpus import load_corpus
from depthscope.errors import ConfigError
from depthscope.figures.rank import plot_rank_vs_width
from depthscope.inputs import ModelRef
from depthscope.pipelines.files import save_figures, write_json
from depthscope.probes import capture
from depthscope.probes.load import load_model
from depthscope.probes.settings import CaptureSettings
from depthscope.schemes import ModelConfig
from depthscope.trace import load_trace, split_models
from depthscope.train import TrainConfig, train


def measure(
    path: str | Path | ModelRef,
    settings: CaptureSettings,
    corpus=None,
    energy: float = 0.99,
    kappa: float | None = None,
    variant: str = "v1",
    *,
    progress: bool = False,
    trust_remote_code: bool = False,
) -> list[dict]:
    """``rank_summary`` of each model in a trace captured with ``--rank``, or of a model (a
    checkpoint, a model directory, a zoo name, a hub id) captured now with ``settings`` (``rank`` on).
    """
    ref = ModelRef.of(path)
    if ref.kind == "trace":
        traces = split_models(load_trace(ref.path))
    else:
        model = load_model(ref, settings.placement, trust_remote_code=trust_remote_code, progress=progress)
        ranked = settings.replace(rank=True)
        traces = [capture(model, corpus, ranked, progress=progress, checkpoint=ref.text)]
    for t in traces:
        if "source_spectrum" not in t:
            raise ConfigError(f"{path}: the trace has no output covariances; capture it with --rank")
    return [rank_summary(t, energy, kappa, variant) for t in traces]


def rank_sweep(
    widths: list[int],
    schemes: tuple[str, ...] = ("standard", "dca"),
    *,
    n_layers: int = 4,
    steps: int = 300,
    tokens: int = 8192,
    energy: float = 0.99,
    seed: int = 0,
    progress: bool = True,
) -> xr.Dataset:
    """Train a small model of each scheme at each width on the default corpus and measure r*/d.

    Returns a Dataset with dims (scheme, width, rank_kind): ``collective_rank``,
    ``collective_rank_ratio`` and the final ``val_loss`` of each model. Heads are width / 16
    (at least 2), so the head size stays 16.
    """
    corpus = load_corpus()
    r = np.full((len(schemes), len(widths), len(KINDS)), np.nan)
    loss = np.full((len(schemes), len(widths)), np.nan)
    for i, scheme in enumerate(schemes):
        for j, width in enumerate(widths):
            cfg = ModelConfig(
                scheme=scheme, n_layers=n_layers, d_model=width, n_heads=max(2, width // 16), ctx=128
            )
            model = train(
                cfg,
                TrainConfig(steps=steps, seed=seed),
                corpus,
                progress=progress,
                label=f"sweep {scheme} d={width}",
            )
            settings = CaptureSettings(n_tokens=tokens, seed=seed, rank=True)
            ranks = collective_rank(capture(model, corpus, settings, progress=False), energy)
            r[i, j] = ranks["collective_rank"].values
            loss[i, j] = model.training_summary["val_loss"]
    coords = {
        "scheme": np.array(schemes, dtype=object),
        "width": np.array(widths),
        "rank_kind": np.array(KINDS, dtype=object),
    }
    out = xr.Dataset(
        {
            "collective_rank": (("scheme", "width", "rank_kind"), r),
            "collective_rank_ratio": (
                ("scheme", "width", "rank_kind"),
                r / np.asarray(widths)[None, :, None],
            ),
            "val_loss": (("scheme", "width"), loss),
        },
        coords=coords,
        attrs={"n_layers": n_layers, "steps": steps, "tokens": tokens, "energy": energy, "seed": seed},
    )
    out["collective_rank"].attrs.update(long_name="collective rank r*", units="1")
    out["collective_rank_ratio"].attrs.update(long_name="r*/d", units="1")
    out["val_loss"].attrs.update(long_name="validation loss", units="nats/byte")
    return out


def run_sweep(out_dir: Path, widths: list[int], schemes: tuple[str, ...], **kwargs) -> dict:
    """``rank_sweep``, then ``sweep.nc``, ``sweep.json`` and the r*/d figure in ``out_dir``.

    Returns:
        The JSON record.
    """
    table = rank_sweep(widths, schemes, **kwargs)
    with atomic_path(out_dir / "sweep.nc") as tmp:
        table.to_netcdf(tmp, engine="netcdf4")
    doc = {
        "widths": list(widths),
        "schemes": list(schemes),
        "r_star": {
            s: {k: table["collective_rank"].sel(scheme=s, rank_kind=k).values.tolist() for k in KINDS}
            for s in schemes
        },
        "ratio": {
            s: table["collective_rank_ratio"].sel(scheme=s, rank_kind="numerical").values.tolist()
            for s in schemes
        },
        "val_loss": {s: table["val_loss"].sel(scheme=s).values.tolist() for s in schemes},
        "settings": dict(table.attrs),
    }
    write_json(out_dir / "sweep.json", doc)
    save_figures(out_dir, {"rank-vs-width": plot_rank_vs_width(table).figure})
    return doc
