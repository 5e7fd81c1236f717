"""Building a zoo collection (pipelines.zoo): incremental, reproducible, trajectories kept."""

from __future__ import annotations

import json

import pytest

from depthscope import zoo
from depthscope.errors import DepthscopeError
from depthscope.pipelines.zoo import build, step_path
from depthscope.trace import load_trace

TINY = zoo.Collection(
    name="tiny",
    directory=zoo.ZOO_DIR / "never-written",
    size=dict(n_layers=1, d_model=16, n_heads=2, ctx=32),
    steps=4,
    entries=(zoo.Entry("standard", "standard"), zoo.Entry("attnres", "attnres", {}, True)),
    batch=2,
)


def quiet_build(out, **kw):
    log: list[str] = []
    entries = build(out, collection=TINY, progress=False, log=log.append, **kw)
    return entries, log


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo")
    entries, log = quiet_build(out)
    return out, entries, log


def test_a_build_trains_every_entry_and_keeps_trajectories(built):
    out, entries, log = built
    assert [e["name"] for e in entries] == ["standard", "attnres"]
    assert [m["name"] for m in zoo.read_manifest(out)] == ["standard", "attnres"]
    assert all(e["config"]["n_layers"] == 1 and e["steps"] == 4 for e in entries)
    traj = entries[1]["trajectory"]
    assert traj["steps"] == [*zoo.trajectory_steps(4), 4] == [1, 2, 4]
    trace = load_trace(out / traj["file"])
    assert list(trace["step"].values) == [1, 2, 4] and "source_spectrum" in trace
    assert "trajectory" not in entries[0]


def test_a_second_build_skips_what_is_up_to_date(built):
    out, entries, _ = built
    again, log = quiet_build(out)
    assert log == ["zoo standard: up to date, skipped", "zoo attnres: up to date, skipped"]
    assert [e["sha256"] for e in again] == [e["sha256"] for e in entries]


def test_a_lost_trajectory_is_rebuilt_with_the_same_weights(built, tmp_path):
    out, entries, _ = built
    for f in out.rglob("*"):  # a copy of the built zoo without its trajectory nor its steps
        if f.is_file() and "steps" not in f.parts and "trajectories" not in f.parts:
            (tmp_path / f.relative_to(out)).write_bytes(f.read_bytes())
    manifest = json.loads((tmp_path / zoo.MANIFEST).read_text())
    del manifest["models"][1]["trajectory"]
    (tmp_path / zoo.MANIFEST).write_text(json.dumps(manifest))
    again, log = quiet_build(tmp_path)
    assert log[0] == "zoo standard: up to date, skipped" and log[1].startswith("zoo attnres: trained")
    assert again[1]["weights_sha256"] == entries[1]["weights_sha256"]  # reproduced bit for bit
    assert again[1]["trajectory"]["steps"] == [1, 2, 4]
    assert step_path(tmp_path, "attnres", 2).is_file()


def test_unknown_entries_are_refused_before_any_work(tmp_path):
    with pytest.raises(DepthscopeError, match="unknown zoo entries: resnext"):
        quiet_build(tmp_path, only=["resnext"])
    assert not list(tmp_path.iterdir())


def test_collections_by_name():
    assert zoo.collection("deep") is zoo.DEEP and zoo.collection("zoo") is zoo.ZOO
    with pytest.raises(DepthscopeError, match="unknown zoo collection 'wide'"):
        zoo.collection("wide")


SEEDED = zoo.Collection(
    name="seeded",
    directory=zoo.ZOO_DIR / "never-written",
    size=dict(n_layers=1, d_model=16, n_heads=2, ctx=32),
    steps=4,
    entries=(zoo.Entry("standard", "standard"), zoo.Entry("wide", "standard", size=dict(d_model=24))),
    batch=2,
    seeds=(0, 1),
    eval_every=2,
    kept_seeds=(0,),
)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    out = tmp_path_factory.mktemp("seeded")
    # two builds of one directory, as two cores run them: each merges its runs into the manifest
    build(out, collection=SEEDED, only=["standard"], progress=False, log=lambda _: None)
    build(out, collection=SEEDED, only=["wide.seed1"], progress=False, log=lambda _: None)
    return out


def test_a_several_seed_build_records_curves_and_traces_and_keeps_seed_0(seeded):
    entries = {m["name"]: m for m in zoo.read_manifest(seeded)}
    assert list(entries) == ["standard.seed0", "standard.seed1", "wide.seed1"]  # collection order
    assert [entries[n]["seed"] for n in entries] == [0, 1, 1]
    assert (
        entries["wide.seed1"]["config"]["d_model"] == 24
        and entries["standard.seed1"]["config"]["d_model"] == 16
    )
    for m in entries.values():
        assert [s for s, _ in m["val_curve"]] == [2, 4] and m["val_curve"][-1][1] == m["val_loss"]
        trace = load_trace(seeded / m["trace"]["file"])
        assert trace.attrs["label"] == m["name"] and trace.attrs["val_loss"] == pytest.approx(m["val_loss"])
        assert float(trace["contribution_share"].sum("source").max()) == pytest.approx(1, abs=1e-4)
    assert entries["standard.seed0"]["file"] == "standard.seed0.safetensors"  # seed 0 keeps its checkpoint
    assert entries["standard.seed1"]["file"] == "" and entries["wide.seed1"]["file"] == ""
    assert zoo.checkpoints(seeded) == [seeded / "standard.seed0.safetensors"]
    assert len(zoo.traces(seeded)) == 3
    seeds_differ = entries["standard.seed0"]["weights_sha256"] != entries["standard.seed1"]["weights_sha256"]
    assert seeds_differ


def test_a_run_that_keeps_only_its_trace_is_up_to_date_from_the_trace(seeded):
    log: list[str] = []
    build(seeded, collection=SEEDED, only=["standard", "wide.seed1"], progress=False, log=log.append)
    assert all(line.endswith("up to date, skipped") for line in log) and len(log) == 3
    (seeded / "traces" / "standard.seed1.nc").write_bytes(b"not the trace")
    log.clear()
    build(seeded, collection=SEEDED, only=["standard.seed1"], progress=False, log=log.append)
    assert log[-1].startswith("zoo standard.seed1: trained")
