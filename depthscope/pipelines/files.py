"""Writing a pipeline's outputs: JSON records and figures, each atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from depthscope.atomic import atomic_path


def json_default(o: Any) -> Any:
    """Numpy arrays and scalars as JSON lists and numbers."""
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_json(path: Path, doc: Any) -> Path:
    """Write ``doc`` to ``path`` as indented JSON (numpy values as lists and numbers), atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(doc, indent=1, default=json_default) + "\n")
    return path


def save_figures(out_dir: Path, figures: dict[str, Any]) -> list[Path]:
    """Each figure as PNG and SVG in ``out_dir`` (named by its key), then closed."""
    import matplotlib.pyplot as plt

    from depthscope.figures.style import save

    written = []
    for name, fig in figures.items():
        written += save(fig, out_dir / name)
        plt.close(fig)
    return written
