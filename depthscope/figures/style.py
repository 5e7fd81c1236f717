"""The house style of every depthscope figure, stable scheme colours, and atomic saving.

Figures are drawn inside ``house_style()`` (an rc context: font sizes, no top/right spines, the
colour-blind-safe seaborn "colorblind" palette, dpi, constrained layout), so the user's global
rcParams are left alone. Nothing here picks a backend: pyplot falls back to Agg by itself where no
display exists, and ``save`` renders through the figure's canvas, never through ``show()``.
"""

from __future__ import annotations

import contextlib
import functools
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import matplotlib
from cycler import cycler

from depthscope.atomic import atomic_path
from depthscope.errors import DepthscopeError

# seaborn's "colorblind" palette (seaborn.color_palette("colorblind").as_hex()), kept here so the
# style does not need seaborn at import time; a test checks the two agree.
PALETTE = (
    "#0173b2",  # blue
    "#de8f05",  # orange
    "#029e73",  # green
    "#d55e00",  # vermillion
    "#cc78bc",  # pink
    "#ca9161",  # brown
    "#fbafe4",  # light pink
    "#949494",  # grey
    "#ece133",  # yellow
    "#56b4e9",  # sky blue
)

# seaborn's "dark" palette, hue by hue as PALETTE (EXTRA[i] is a dark shade of PALETTE[i]): the
# colours of a scheme's second model in one figure, and the overflow beyond PALETTE
EXTRA = (
    "#001c7f",
    "#b1400d",
    "#12711c",
    "#8c0800",
    "#591e71",
    "#592f0d",
    "#a23582",
    "#3c3c3c",
    "#b8850a",
    "#006374",
)

DIVERGING_CMAP = "RdBu_r"  # weights and shares: blue negative, white 0, red positive
SEQUENTIAL_CMAP = "viridis"  # ordered quantities such as source depth
DPI = 200  # saved raster figures
MAX_TICK_LABELS = 40  # more labels than this on an axis are thinned to every k-th

RC = {
    "figure.dpi": 100,
    "savefig.dpi": DPI,
    "figure.constrained_layout.use": True,
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.title_fontsize": 8,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": cycler(color=list(PALETTE)),
    "lines.linewidth": 1.6,
    "lines.markersize": 4,
    "image.cmap": DIVERGING_CMAP,
    "svg.hashsalt": "depthscope",  # stable element ids: the same figure gives the same SVG
    "text.parse_math": False,  # labels come from files: "$x^$" is text, not (broken) mathtext
}


@contextlib.contextmanager
def house_style() -> Iterator[None]:
    """Apply the depthscope rcParams inside the block (the previous values come back after)."""
    with matplotlib.rc_context(RC):
        yield


def styled(fn):
    """Decorator: run a plot function inside ``house_style()``; its log-scale tick labels plain."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with house_style():
            out = fn(*args, **kwargs)
        fig = getattr(out, "figure", out)
        for ax in getattr(fig, "axes", ()):
            plain_log_ticks(ax)
        return out

    return wrapper


def _plain(value: float, _pos=None) -> str:
    return f"{value:g}"


def plain_log_ticks(ax) -> None:
    """Plain numbers for an Axes' log and symlog tick labels: matplotlib's log formatters write
    mathtext (a "mathdefault" source string), which the house style shows raw, since it never parses
    math (labels come from files). Minor ticks of a log axis lose their labels.
    """
    from matplotlib.ticker import FuncFormatter, LogFormatter, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() not in ("log", "symlog"):
            continue
        if isinstance(axis.get_major_formatter(), LogFormatter):
            axis.set_major_formatter(FuncFormatter(_plain))
        if isinstance(axis.get_minor_formatter(), LogFormatter):
            axis.set_minor_formatter(NullFormatter())


def apply_house_style() -> None:
    """Set the depthscope rcParams globally (for notebooks that draw their own figures too)."""
    matplotlib.rcParams.update(RC)


def subplots(*args, **kwargs):
    """``pyplot.subplots`` (pyplot-managed figures, so notebooks display them; never shown here).

    pyplot is imported on first use, in this module only: its figure-manager and backend
    machinery is the slow part of importing matplotlib, and importing the figures need not pay it.
    """
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def new_figure(figsize: tuple[float, float] | None = None):
    """A fresh empty pyplot-managed Figure (as ``subplots``)."""
    import matplotlib.pyplot as plt

    return plt.figure(figsize=figsize)


def new_axes(figsize: tuple[float, float] | None = None):
    """A fresh Figure with one Axes (as ``subplots``)."""
    return subplots(figsize=figsize)[1]


def style_axes(ax, *, spines: bool = False):
    """Give an Axes made elsewhere the house look: no top/right spines, house tick sizes."""
    for side in ("top", "right"):
        ax.spines[side].set_visible(spines)
    ax.tick_params(labelsize=RC["xtick.labelsize"])
    return ax


# One colour per scheme in every figure, keyed by the ``scheme`` a trace records (an attr of one
# trace, a coordinate along ``model`` of a stack); the colours are PALETTE's, then its dark shades
# (EXTRA) once PALETTE is spent, so they stay colour-blind safe. A scheme not listed hashes into
# PALETTE.
SCHEME_COLORS = {
    "standard": "#949494",
    "denseformer": "#0173b2",
    "dca": "#de8f05",
    "attnres": "#029e73",
    "hc": "#d55e00",
    "mhc": "#cc78bc",
    "shc": "#591e71",  # the 2026 schemes: PALETTE is spent, so dark shades (EXTRA), as distinct
    "ddl": "#ca9161",
    "shortswa": "#56b4e9",
    "muddformer": "#fbafe4",
    "value-residual": "#12711c",
    "depth-attention": "#006374",
    "moda": "#001c7f",
    "frac": "#592f0d",
}
_SKIPPED = ("#ece133",)  # yellow: too pale for lines on white, never handed out as a free colour


def scheme_color(scheme: str) -> str:
    """The stable colour of a scheme (``SCHEME_COLORS``); an unknown scheme hashes into PALETTE."""
    scheme = str(scheme)
    return SCHEME_COLORS[scheme] if scheme in SCHEME_COLORS else _hashed(scheme)


def _hashed(name: str) -> str:
    return PALETTE[zlib.crc32(name.encode()) % len(PALETTE)]  # crc32: stable across runs, unlike hash()


def model_colors(models: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Colours of the models of one figure, by label, from (label, scheme) pairs.

    Each model wants its scheme's colour (``scheme_color``; a model without a scheme, its label's
    hash: never a colour looked up from the label). The first model to want a colour gets it, so
    every scheme keeps its colour whatever comes before it; a later model of that scheme (two
    AttnRes variants, runs of one scheme) gets the dark shade of the same hue (EXTRA), else the
    first colour still free.
    """
    models = [(str(label), str(scheme)) for label, scheme in models]
    wanted = {label: scheme_color(scheme) if scheme else _hashed(label) for label, scheme in models}
    owner: dict[str, str] = {}
    for label, _ in models:
        owner.setdefault(wanted[label], label)
    claimed = set(owner)
    out: dict[str, str] = {}
    for label, _ in models:
        colour = wanted[label]
        if owner[colour] != label:
            colour = _free(colour, claimed)
            claimed.add(colour)
        out[label] = colour
    return out


def _free(colour: str, claimed: set[str]) -> str:
    """The dark shade of ``colour``'s hue if free, else the first free colour (EXTRA, then PALETTE)."""
    shade = [EXTRA[PALETTE.index(colour)]] if colour in PALETTE else []
    spare = [c for c in (*shade, *EXTRA, *PALETTE) if c not in claimed and c not in _SKIPPED]
    return spare[0] if spare else colour


# Formats whose suffix ``save`` strips from the path it is given, to append each requested one.
_IMAGE_SUFFIXES = {".png", ".svg", ".pdf", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp"}
_NO_DATE = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}  # byte-stable output
_CAPTION_KEY = {"pdf": "Subject", "svg": "Description"}


def save(
    fig,
    path: str | Path,
    formats: Sequence[str] = ("png", "svg"),
    *,
    dpi: int = DPI,
    caption: str | None = None,
) -> list[Path]:
    """Write ``fig`` once per format as ``path`` with that suffix; returns the written paths.

    ``caption``: kept in the file's metadata where the format has a field for it (PDF subject, SVG
    description).

    All formats are rendered to temporary files first and renamed only when every one has
    succeeded, so a failed save leaves no new or partial file. A directory that cannot be written
    raises DepthscopeError. ``path`` may carry an image suffix (``fig.png``); it is replaced.
    """
    path = Path(path)
    stem = path.with_suffix("") if path.suffix.lower() in _IMAGE_SUFFIXES else path
    formats = [f.lower().lstrip(".") for f in ([formats] if isinstance(formats, str) else formats)]
    if not formats:
        raise DepthscopeError("no figure format given")
    supported = fig.canvas.get_supported_filetypes()
    unknown = [f for f in formats if f not in supported]
    if unknown:
        raise DepthscopeError(
            f"unknown figure format {unknown[0]!r} (supported: {', '.join(sorted(supported))})"
        )
    targets = [stem.with_name(f"{stem.name}.{f}") for f in dict.fromkeys(formats)]
    try:
        with contextlib.ExitStack() as stack:  # renames happen on exit, after every render
            stack.enter_context(matplotlib.rc_context({"svg.hashsalt": RC["svg.hashsalt"]}))
            for target in targets:
                tmp = stack.enter_context(atomic_path(target))
                fmt = target.suffix[1:]
                meta = dict(_NO_DATE.get(fmt, {}))
                if caption and fmt in _CAPTION_KEY:
                    meta[_CAPTION_KEY[fmt]] = caption
                fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight", metadata=meta or None)
    except OSError as err:
        raise DepthscopeError(f"cannot write figure {path}: {err.strerror or err}") from None
    return targets
