"""House style, scheme colours, and atomic saving."""

from __future__ import annotations

import os
import zlib

import matplotlib
import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from depthscope.errors import DepthscopeError
from depthscope.figures import house_style, model_colors, save, scheme_color
from depthscope.figures.style import EXTRA, PALETTE, RC

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def small_figure() -> Figure:
    fig = Figure(figsize=(2, 1.5))
    ax = fig.add_subplot()
    ax.plot([0, 1, 2], [1, 0.5, 0.25])
    ax.set_title("t")
    return fig


def test_palette_is_seaborn_colorblind():
    import seaborn as sns

    assert list(PALETTE) == sns.color_palette("colorblind").as_hex()
    assert list(EXTRA) == sns.color_palette("dark").as_hex()  # a dark shade of each hue, in order
    from depthscope.figures.style import SCHEME_COLORS
    from depthscope.schemes import scheme_names

    assert set(scheme_names()) == set(SCHEME_COLORS)  # every scheme has its colour
    assert set(SCHEME_COLORS.values()) <= (set(PALETTE) | set(EXTRA)) - {"#ece133"}  # yellow: too pale
    assert len(set(SCHEME_COLORS.values())) == len(SCHEME_COLORS)


def test_house_style_applies_and_restores():
    before = matplotlib.rcParams["axes.spines.top"], matplotlib.rcParams["font.size"]
    with house_style():
        assert matplotlib.rcParams["axes.spines.top"] is False
        assert matplotlib.rcParams["axes.spines.right"] is False
        assert matplotlib.rcParams["font.size"] == RC["font.size"]
        assert matplotlib.rcParams["axes.prop_cycle"].by_key()["color"] == list(PALETTE)
    assert (matplotlib.rcParams["axes.spines.top"], matplotlib.rcParams["font.size"]) == before


def test_scheme_colours_are_stable_and_keyed_by_scheme_name():
    from depthscope.figures.style import SCHEME_COLORS

    assert scheme_color("denseformer") == SCHEME_COLORS["denseformer"]
    unknown = scheme_color("my-new-scheme")
    assert unknown in PALETTE
    assert unknown == PALETTE[zlib.crc32(b"my-new-scheme") % len(PALETTE)]  # not the salted hash()
    # a scheme's name is the key: nothing is parsed out of it
    assert scheme_color("attnres-block4") == PALETTE[zlib.crc32(b"attnres-block4") % len(PALETTE)]


def test_model_colours_follow_the_scheme_and_are_distinct_within_a_figure():
    models = [
        ("standard", "standard"),
        ("attnres", "attnres"),
        ("attnres-block4", "attnres"),
        ("dca", "dca"),
        ("grn-v1", "dca"),
        ("denseformer", "denseformer"),
        ("my run", ""),
    ]
    colours = model_colors(models)
    assert list(colours) == [label for label, _ in models]
    assert len(set(colours.values())) == len(models)
    assert colours["attnres"] == scheme_color("attnres")  # the first of a scheme keeps its colour
    assert colours["dca"] == scheme_color("dca")
    assert colours["attnres-block4"] != colours["attnres"] and "#ece133" not in colours.values()
    # a scheme's second model takes the dark shade of its hue, never another scheme's colour
    assert colours["attnres-block4"] == EXTRA[PALETTE.index(scheme_color("attnres"))]
    assert colours["grn-v1"] == EXTRA[PALETTE.index(scheme_color("dca"))]
    assert colours["denseformer"] == scheme_color("denseformer")
    assert colours["my run"] == PALETTE[zlib.crc32(b"my run") % len(PALETTE)]  # no scheme: the label's hash
    # the label plays no part in the colour of a model with a scheme
    assert model_colors([("dca", "attnres")]) == {"dca": scheme_color("attnres")}


def test_save_writes_each_format_atomically(tmp_path):
    fig = small_figure()
    paths = save(fig, tmp_path / "sub" / "curve")
    assert paths == [tmp_path / "sub" / "curve.png", tmp_path / "sub" / "curve.svg"]
    assert paths[0].read_bytes().startswith(PNG_MAGIC)
    assert b"<svg" in paths[1].read_bytes()[:1000]
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == [
        "curve.png",
        "curve.svg",
    ]  # no temporaries
    mask = os.umask(0o022)
    os.umask(mask)
    assert all(p.stat().st_mode & 0o777 == 0o666 & ~mask for p in paths)  # not mkstemp's 0600


def test_save_replaces_an_image_suffix_and_is_byte_stable(tmp_path):
    fig = small_figure()
    (a,) = save(fig, tmp_path / "fig.png", formats=("svg",))
    assert a == tmp_path / "fig.svg"
    first = a.read_bytes()
    save(fig, tmp_path / "fig", formats="svg")
    assert a.read_bytes() == first
    assert save(fig, tmp_path / "fig.v2", formats=["pdf"]) == [tmp_path / "fig.v2.pdf"]


def test_failed_savefig_leaves_no_file(tmp_path, monkeypatch):
    real = Figure.savefig
    calls = []

    def broken(self, fname, *args, **kwargs):
        calls.append(kwargs.get("format"))
        if kwargs.get("format") == "svg":  # png goes through, then svg dies half-way
            with open(fname, "wb") as fh:
                fh.write(b"<svg partial")
            raise RuntimeError("renderer crashed")
        return real(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", broken)
    old = tmp_path / "plot.svg"
    old.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="renderer crashed"):
        save(small_figure(), tmp_path / "plot")
    assert calls == ["png", "svg"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.svg"]  # no png, no temporaries
    assert old.read_bytes() == b"old"  # the previous file is untouched


def test_failed_write_after_some_bytes_leaves_nothing(tmp_path, monkeypatch):
    def broken(self, fname, *args, **kwargs):
        with open(fname, "wb") as fh:
            fh.write(PNG_MAGIC)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(DepthscopeError, match="No space left"):
        save(small_figure(), tmp_path / "plot", formats=("png",))
    assert list(tmp_path.iterdir()) == []


def test_unwritable_directory_is_a_depthscope_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(DepthscopeError) as info:
        save(small_figure(), blocker / "figs" / "plot")
    assert "\n" not in str(info.value)
    assert str(blocker / "figs" / "plot") in str(info.value)


def test_unknown_format_is_a_depthscope_error(tmp_path):
    with pytest.raises(DepthscopeError, match="unknown figure format 'bmpx'"):
        save(small_figure(), tmp_path / "plot", formats=("png", "bmpx"))
    assert list(tmp_path.iterdir()) == []
