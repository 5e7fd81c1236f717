"""The bundled zoo: manifest matches files, every checkpoint loads and captures, size budget."""

from __future__ import annotations

import numpy as np
import pytest

from depthscope import load, zoo
from depthscope.probes import capture
from depthscope.schemes.checkpoint import read_meta

ENTRIES = zoo.read_manifest()
DEEP = zoo.read_manifest(zoo.DEEP.directory)
BOTH = [(zoo.ZOO, m) for m in ENTRIES] + [(zoo.DEEP, m) for m in DEEP]
ID = lambda x: getattr(x, "name", None) or x["name"]  # noqa: E731


def test_manifest_lists_the_zoo_spec():
    assert [m["name"] for m in ENTRIES] == zoo.ZOO.names()
    schemes = {m["scheme"] for m in ENTRIES}
    assert schemes == {"standard", "denseformer", "dca", "attnres", "hc", "mhc", "ddl", "shortswa"}


def test_zoo_fits_the_size_budget():
    total = sum((zoo.ZOO_DIR / m["file"]).stat().st_size for m in ENTRIES)
    assert total <= 10 * 1024 * 1024
    assert all(m["config"]["n_layers"] >= 8 for m in ENTRIES)
    deep = sum((zoo.DEEP.directory / m["file"]).stat().st_size for m in DEEP)
    assert deep <= 13 * 1024 * 1024 and all(m["config"]["n_layers"] == 16 for m in DEEP)


def test_the_deep_zoo_is_the_zoo_families_at_twice_the_depth():
    assert [m["name"] for m in DEEP] == zoo.DEEP.names()
    by_name = {m["name"]: m for m in ENTRIES}
    for e, m in zip(zoo.DEEP.entries, DEEP):
        twin = by_name[e.key]
        assert m["scheme"] == twin["scheme"] and m["steps"] == twin["steps"] // 2
        assert {**m["config"], "n_layers": 8, "options": {}} == {**twin["config"], "options": {}}
    blocks = {m["name"]: m["config"]["options"].get("blocks") for m in DEEP}
    assert blocks["attnres-block8"] == 8 and by_name["attnres-block4"]["config"]["options"]["blocks"] == 4


@pytest.mark.parametrize("coll, entry", BOTH, ids=ID)
def test_manifest_matches_file(coll, entry):
    path = coll.directory / entry["file"]
    assert path.stat().st_size == entry["bytes"] and zoo.sha256(path) == entry["sha256"]
    assert zoo.weights_sha256(path) == entry["weights_sha256"]
    meta = read_meta(path)
    assert meta["model"] == entry["config"] and meta["model"]["scheme"] == entry["scheme"]
    assert meta["training"]["val_loss"] == entry["val_loss"] and meta["training"]["steps"] == entry["steps"]
    assert meta["training"]["seed"] == entry["seed"] and "python-stdlib" in entry["corpus"]
    model = load(path)  # checks every tensor's presence, shape and finiteness
    assert model.n_params() == entry["params"]
    assert entry["val_loss"] < 3.0  # trained: well below the 5.55 nats/byte of a uniform guess


@pytest.mark.parametrize("coll, entry", BOTH, ids=ID)
def test_every_checkpoint_captures(coll, entry):
    trace = capture(load(coll.directory / entry["file"]), n_tokens=256)
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-5)
    assert float(trace["residual_error"].max()) < 1e-4


def test_zoo_cli_build_and_list(tmp_path, capsys):
    from depthscope.cli import main

    out = tmp_path / "zoo"
    assert main(["zoo", "build", "--out", str(out), "--steps", "1", "--only", "standard", "--quiet"]) == 0
    [entry] = zoo.read_manifest(out)
    assert entry["name"] == "standard" and entry["steps"] == 1 and entry["config"] == ENTRIES[0]["config"]
    assert zoo.weights_sha256(out / entry["file"]) == entry["weights_sha256"]
    capsys.readouterr()
    assert main(["zoo", "list", "--dir", str(out)]) == 0
    listing = capsys.readouterr().out
    assert "standard" in listing and f"{entry['val_loss']:.3f}" in listing
    assert main(["zoo", "list"]) == 0
    listing = capsys.readouterr().out
    assert all(m["name"] in listing for m in ENTRIES)


def test_zoo_cli_bad_input(tmp_path, capsys):
    from depthscope.cli import main

    assert main(["zoo", "list", "--dir", str(tmp_path)]) == 2
    assert "no zoo manifest" in capsys.readouterr().err
    assert main(["zoo", "build", "--out", str(tmp_path), "--only", "resnext", "--quiet"]) == 2
    assert "unknown zoo entries: resnext" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_zoo_list_shows_every_collection_with_its_directory_and_whole_names(capsys):
    from depthscope import zoo as bundled
    from depthscope.cli import main

    assert main(["zoo", "list"]) == 0
    text = capsys.readouterr().out
    for coll in bundled.COLLECTIONS.values():
        assert str(coll.directory) in text
    assert "deep/attnres-block8" in text and "attnres-block4.safetensors" in text  # never cut


SEEDED = zoo.read_manifest(zoo.SEEDS.directory)


def test_the_seeds_collection_holds_three_seeds_of_every_variant_and_the_grown_baselines():
    assert [m["name"] for m in SEEDED] == zoo.SEEDS.names()
    by_variant: dict[str, list[int]] = {}
    for m in SEEDED:
        by_variant.setdefault(m["name"].rsplit(".seed", 1)[0], []).append(m["seed"])
    assert all(sorted(s) == [0, 1, 2] for s in by_variant.values())
    schemes = {m["scheme"] for m in SEEDED}
    assert len(schemes) >= 8 and "muddformer" in schemes
    sizes = {
        m["name"].rsplit(".seed", 1)[0]: (m["config"]["n_layers"], m["config"]["d_model"]) for m in SEEDED
    }
    assert (
        sizes["standard"] == (8, 64)
        and sizes["standard-9blocks"] == (9, 64)
        and sizes["standard-w72"] == (8, 72)
    )
    for m in SEEDED:
        assert [s for s, _ in m["val_curve"]] == list(range(100, 1001, 100))
        assert m["val_curve"][-1][1] == m["val_loss"] and np.isfinite(m["val_loss"])
        trace = zoo.SEEDS.directory / m["trace"]["file"]
        assert zoo.sha256(trace) == m["trace"]["sha256"]
        assert bool(m["file"]) == (m["seed"] == 0)  # checkpoints are kept for seed 0 only
        if m["file"]:
            assert zoo.sha256(zoo.SEEDS.directory / m["file"]) == m["sha256"]
        if m["scheme"] in ("hc", "mhc"):
            assert m["streams"]["n_streams"] == 4 and 1 <= m["streams"]["participation_ratio"] <= 4 + 1e-9
