"""`depthscope rank` and its subcommands end to end (small sizes), JSON output, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from depthscope.analysis.theory import derived_bound, threshold
from depthscope.cli import main

SMALL = ["--layers", "2", "--d-model", "16", "--heads", "2", "--ctx", "32", "--batch-size", "4", "--quiet"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("rank") / "m.safetensors"
    assert main(["train", "--scheme", "dca", "--steps", "3", "--out", str(path), *SMALL]) == 0
    return path


def test_rank_of_a_checkpoint_json(ckpt, capsys):
    assert main(["rank", str(ckpt), "--kappa", "0.5", "--tokens", "256", "--json", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["d"] == 16 and res["scheme"] == "dca" and res["n_layers_counted"] == 4
    nums = [s["numerical"] for s in res["sources"] if s["source"] != "embed"]
    assert res["collective_rank"]["numerical"] == sum(nums)
    assert res["ratio"]["numerical"] == pytest.approx(sum(nums) / 16)
    assert res["threshold"] == threshold(16, 0.5, "v1")
    assert res["derived_bound"] == pytest.approx(derived_bound(0.5))
    verdict = "to help" if res["ratio"]["numerical"] < res["threshold"] else "no gain"
    assert verdict in res["conclusion"] and "kappa = 0.5" in res["conclusion"]
    assert main(["rank", str(ckpt), "--kappa", "0.5", "--tokens", "256", "--quiet"]) == 0
    assert res["conclusion"] in " ".join(capsys.readouterr().out.split())  # the sentence, printed


def test_rank_of_a_trace(ckpt, tmp_path, capsys):
    trace = tmp_path / "t.nc"
    assert main(["capture", str(ckpt), "--out", str(trace), "--tokens", "64", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["rank", str(trace)]) == 2  # no covariances in a plain capture
    assert "--rank" in capsys.readouterr().err


def test_threshold_json(capsys):
    assert main(["rank", "threshold", "--d", "40", "--kappa", "0.3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res) == {"d", "kappa", "variant", "threshold", "derived_bound"}
    assert res["threshold"] == threshold(40, 0.3, "v1") and res["derived_bound"] == pytest.approx(
        derived_bound(0.3)
    )
    assert main(["rank", "threshold", "--d", "40", "--kappa", "0.3", "--variant", "v2", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["variant"] == "v2" and res["derived_bound"] == pytest.approx(derived_bound(0.3, "v2", d=40))


def test_identity_writes_json_and_figures(tmp_path, capsys):
    out = tmp_path / "id"
    assert main(["rank", "identity", "--out", str(out), "--steps", "30", "--no-sweep"]) == 0
    doc = json.loads((out / "identity.json").read_text())
    assert doc["settings"]["steps"] == 30 and doc["settings"]["d"] == 100
    for task in ("identity", "random"):
        for model in ("resnet", "grn_v1"):
            assert len(doc["curves"][task][model]) == 31
        assert doc["curves"][task]["resnet"][0] == pytest.approx(
            doc["curves"][task]["grn_v1"][0]
        )  # same start
    assert (out / "identity.png").is_file() and (out / "identity.svg").is_file()
    assert "GRN-v1 reaches" in capsys.readouterr().out


def test_sweep_writes_table_and_figure(tmp_path, capsys):
    out = tmp_path / "sw"
    rc = main(
        [
            "rank",
            "sweep",
            "--width",
            "32",
            "--width",
            "48",
            "--layers",
            "1",
            "--steps",
            "2",
            "--tokens",
            "256",
            "--out",
            str(out),
            "--quiet",
            "--json",
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    table = xr.open_dataset(out / "sweep.nc").load()
    assert table.sizes["width"] == 2 and table.sizes["scheme"] == 2
    np.testing.assert_allclose(
        table["collective_rank_ratio"].sel(rank_kind="numerical").values,
        [doc["ratio"]["standard"], doc["ratio"]["dca"]],
    )
    assert (out / "rank-vs-width.png").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (["threshold", "--d", "100", "--kappa", "1.5"], "1.5 is not in the range 0 < x <= 1"),
        (["threshold", "--d", "100", "--kappa", "0"], "0 is not in the range 0 < x <= 1"),
        (["threshold", "--d", "1", "--kappa", "0.5"], "Invalid value for '--d'"),
        (["threshold", "--d", "100", "--kappa", "0.5", "--tasks", "0"], "Invalid value for '--tasks'"),
        (["threshold", "--d", "100", "--kappa", "0.5", "--variant", "v9"], "'v9' is not one of 'v1', 'v2'"),
        (["theory", "--variant", "v3", "--out", "OUT"], "'v3' is not one of 'v1', 'v2'"),
        (["identity", "--steps", "0", "--out", "OUT"], "Invalid value for '--steps'"),
        (["sweep", "--width", "x", "--out", "OUT"], "Invalid value for '--width'"),
        (["sweep", "--width", "16", "--out", "OUT"], "Invalid value for '--width'"),
        (["sweep", "--width", "40", "--out", "OUT"], "multiples of 16"),
        (["sweep", "--scheme", "resnext", "--out", "OUT"], "unknown scheme"),
        (["no/such/file.safetensors"], "no such file"),
        (["no/such/file.safetensors", "--energy", "0"], "0 is not in the range 0 < x <= 1"),
    ],
)
def test_bad_input(tmp_path, capsys, args, message):
    rc = main(["rank", *[a.replace("OUT", str(tmp_path / "o")) for a in args]])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_theory_figures_and_json(tmp_path, capsys):
    from depthscope.analysis.theory import threshold_curve

    out = tmp_path / "th"
    assert main(["rank", "theory", "--out", str(out), "--variant", "v1", "--tasks", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [g["d"] for g in doc["gain_vs_r_star"]] == [100, 200, 300]
    gains = doc["gain_vs_r_star"][0]["gain"]
    assert gains[0] > gains[-1] > 0  # the gain shrinks as r* grows
    t = doc["threshold_vs_kappa"][0]
    np.testing.assert_allclose(
        t["threshold"], threshold_curve(np.array(t["kappa"]), 100, "v1", n_tasks=1).values
    )
    assert all(b < n for b, n in zip(t["derived_bound"], t["threshold"]))  # the derived bound is sufficient
    for name in ("gain-vs-rank", "gain-vs-lambda", "threshold-vs-kappa"):
        assert (out / f"{name}.png").is_file() and (out / f"{name}.svg").is_file()
