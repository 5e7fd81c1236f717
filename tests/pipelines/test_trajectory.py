"""Trajectories: a run's checkpoints over time, in a report, and in the zoo build."""

from __future__ import annotations

import re

import numpy as np
import pytest

from depthscope import zoo
from depthscope.analysis.dilution import summary
from depthscope.cli import main
from depthscope.trace import load_trace, select_model

SMALL = ["--layers", "2", "--d-model", "16", "--heads", "2", "--ctx", "32", "--batch-size", "4", "--quiet"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    assert (
        main(
            [
                "train",
                "--scheme",
                "attnres",
                "--steps",
                "9",
                "--save-every",
                "3",
                "--out",
                str(d / "a.safetensors"),
                *SMALL,
            ]
        )
        == 0
    )
    return d


def test_report_on_three_checkpoints_of_a_run_has_a_trajectory(run, tmp_path):
    paths = [run / "a.safetensors", run / "a.step-000003.safetensors", run / "a.step-000006.safetensors"]
    out = tmp_path / "rep"
    assert main(["report", *map(str, paths), "--out", str(out), "--tokens", "128", "--quiet"]) == 0
    html = (out / "index.html").read_text()
    run_name = f"attnres-{SMALL[SMALL.index('--layers') + 1]}blocks-steps3-9"  # variant, depth, steps
    assert 'id="trajectory"' in html and (out / f"trajectory-{run_name}.png").is_file()
    assert f"<h3>attnres, {SMALL[SMALL.index('--layers') + 1]} blocks, steps 3-9</h3>" in html
    steps = [int(s) for s in re.findall(r'<tr data-step="(\d+)">', html)]
    assert steps == [3, 6, 9]  # in step order, whatever the order given
    stacked = load_trace(out / "traces.nc")
    assert list(stacked["model"].values) == ["attnres@9", "attnres@3", "attnres@6"]
    traj = load_trace(out / f"trajectory-{run_name}.nc")
    assert list(traj["step"].values) == [3, 6, 9] and list(traj["train_tokens"].values) == [384, 768, 1152]
    for step in steps:
        row = re.search(rf'<tr data-step="{step}">(.*?)</tr>', html, re.S).group(1)
        values = [float(v) for v in re.findall(r'data-value="([^"]+)"', row)]
        s = summary(select_model(stacked, f"attnres@{step}"))
        expected = [s["pattern_score"].sel(group=g).item() for g in ("sublayers", "attn", "mlp", "readout")]
        np.testing.assert_allclose(values[1:5], expected, rtol=1e-12)  # after the validation loss
        np.testing.assert_allclose(values[5], s["embed_share"].sel(group="readout").item(), rtol=1e-12)


def test_explicit_steps_and_the_trajectory_flag(run, tmp_path):
    a, b = run / "a.step-000003.safetensors", run / "a.safetensors"
    out = tmp_path / "rep"
    assert (
        main(
            [
                "report",
                str(b),
                str(a),
                "--step",
                "90",
                "--step",
                "30",
                "--out",
                str(out),
                "--tokens",
                "64",
                "--quiet",
            ]
        )
        == 0
    )
    html = (out / "index.html").read_text()
    assert [int(s) for s in re.findall(r'<tr data-step="(\d+)">', html)] == [30, 90]
    assert (
        main(["report", str(a), "--step", "1", "--step", "2", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    )


def test_zoo_build_skips_an_up_to_date_model_and_rebuilds_a_changed_one(tmp_path, capsys):
    out = tmp_path / "zoo"
    assert main(["zoo", "build", "--out", str(out), "--steps", "4", "--only", "hc", "--quiet"]) == 0
    first = capsys.readouterr().out
    assert "zoo hc: trained" in first and "trajectory captured at steps [1, 2, 4]" in first
    [entry] = zoo.read_manifest(out)
    traj = load_trace(out / entry["trajectory"]["file"])
    assert list(traj["step"].values) == [1, 2, 4] == entry["trajectory"]["steps"]
    assert zoo.sha256(out / entry["trajectory"]["file"]) == entry["trajectory"]["sha256"]
    digest = entry["sha256"]
    assert main(["zoo", "build", "--out", str(out), "--steps", "4", "--only", "hc", "--quiet"]) == 0
    assert "zoo hc: up to date, skipped" in capsys.readouterr().out
    assert zoo.read_manifest(out)[0]["sha256"] == digest
    (out / entry["file"]).write_bytes((out / entry["file"]).read_bytes()[:-8] + b"\0" * 8)  # a changed file
    assert main(["zoo", "build", "--out", str(out), "--steps", "4", "--only", "hc", "--quiet"]) == 0
    assert "zoo hc: trained" in capsys.readouterr().out
    [again] = zoo.read_manifest(out)
    assert again["weights_sha256"] == entry["weights_sha256"]  # reproducible: the same weights again
    assert (
        main(["zoo", "build", "--out", str(out), "--steps", "5", "--only", "hc", "--quiet"]) == 0
    )  # new spec
    assert "zoo hc: trained" in capsys.readouterr().out and zoo.read_manifest(out)[0]["steps"] == 5


BUNDLED = [
    (coll, m)
    for coll in (zoo.ZOO, zoo.DEEP)
    for m in zoo.read_manifest(coll.directory)
    if m.get("trajectory")
]


@pytest.mark.parametrize("coll, entry", BUNDLED, ids=lambda x: getattr(x, "name", None) or x["name"])
def test_bundled_trajectories_match_the_manifest(coll, entry):
    path = coll.directory / entry["trajectory"]["file"]
    assert zoo.sha256(path) == entry["trajectory"]["sha256"]
    traj = load_trace(path)
    assert (
        list(traj["step"].values) == entry["trajectory"]["steps"]
        and traj["step"].values[-1] == entry["steps"]
    )
    assert np.all(np.diff(traj["train_tokens"].values) > 0) and np.all(np.isfinite(traj["val_loss"].values))
    assert float(traj["val_loss"].values[-1]) == pytest.approx(entry["val_loss"])
    assert set(traj["scheme"].values) == {entry["scheme"]}
    if "zoo_group" in traj.coords:  # captured by zoo build since groups pair entries across depths
        key = next(e.key for e in coll.entries if e.name == entry["name"])
        assert set(traj["zoo_group"].values) == {key} and "source_spectrum" in traj
    np.testing.assert_allclose(
        traj["contribution_share"].sum("source").where(traj["mixing"].notnull().any("source")), 1.0, atol=1e-5
    )


def test_the_zoo_bundles_a_trajectory_per_family():
    """The standard residual, DenseFormer, AttnRes, Block AttnRes, DCA, HC and mHC keep captures at
    250 ... 4000 steps at 8 blocks and at 125 ... 2000 steps at 16 blocks (the same families)."""
    kept = {m["name"]: m["trajectory"]["steps"] for m in zoo.read_manifest() if m.get("trajectory")}
    assert kept == {
        name: [250, 500, 1000, 2000, 4000]
        for name in ("standard", "denseformer", "dca", "attnres", "attnres-block4", "hc", "mhc")
    }
    deep = {m["name"]: m["trajectory"]["steps"] for m in zoo.read_manifest(zoo.DEEP.directory)}
    assert deep == {e.name: [125, 250, 500, 1000, 2000] for e in zoo.DEEP.entries}


def test_the_cross_run_trajectory_figure_draws_each_bundled_run_per_group():
    """plot_trajectories: one line per run in each consumer-group panel, y = summary's pattern score."""
    from depthscope.figures import plot_trajectories
    from depthscope.figures.curves import TRAJECTORY_GROUPS

    runs = [
        load_trace(zoo.ZOO_DIR / m["trajectory"]["file"]) for m in zoo.read_manifest() if m.get("trajectory")
    ]
    assert len(runs) == 7
    fig = plot_trajectories([summary(run) for run in runs])
    for ax, group in zip(fig.axes, TRAJECTORY_GROUPS):
        data = ax.lines[: len(runs)]  # data lines first, then the uniform row
        assert len(ax.lines) == len(runs) + 1 and ax.lines[-1].get_ydata()[0] == 1.0
        for line, run in zip(data, runs):
            assert line.get_label() == str(run["variant"].values[0])
            np.testing.assert_array_equal(line.get_xdata(), run["train_tokens"].values)
            np.testing.assert_allclose(
                line.get_ydata(), summary(run)["pattern_score"].sel(group=group).values
            )
    with pytest.raises(ValueError):
        plot_trajectories([])
