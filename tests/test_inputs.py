"""Models by name: the bundled zoo's names (as `depthscope zoo list` prints them) and Hugging Face
hub ids ``ORG/NAME[@REVISION]`` resolved through a local cache built here in huggingface_hub's own
layout (``models--ORG--NAME/refs``, ``snapshots/<commit>``), offline: no test ever downloads. The
download path is exercised against a stand-in for ``snapshot_download``.
"""

from __future__ import annotations

import hashlib
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

import depthscope
from depthscope import zoo
from depthscope.cli import main
from depthscope.errors import DepthscopeError
from depthscope.inputs import HUB_FILES, hub_id, input_kind, zoo_names
from depthscope.probes import capture
from depthscope.trace import load_trace
from tests.helpers import build, tiny, tiny_llama
from tests.test_hostile import assert_one_error_line, run

MAIN = hashlib.sha1(b"main").hexdigest()  # the commit refs/main points at
SECOND = hashlib.sha1(b"v2").hexdigest()  # the commit of tag v2
FAST = ["--tokens", "128", "--ctx", "32", "--quiet"]


def save_llama(directory: Path, seed: int) -> None:
    model = tiny_llama(seed)
    with redirect_stderr(io.StringIO()):  # transformers' "Writing model shards" bar
        model.save_pretrained(directory)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A Hugging Face cache holding acme/tiny at two commits: main and the tag v2."""
    root = tmp_path_factory.mktemp("hf-cache")
    repo = root / "models--acme--tiny"
    for ref, commit, seed in (("main", MAIN, 0), ("v2", SECOND, 1)):
        save_llama(repo / "snapshots" / commit, seed)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return root


@pytest.fixture
def offline(cache, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def numbers(trace: xr.Dataset) -> xr.Dataset:
    """A trace's numbers, without the attrs that name where it came from."""
    return trace.drop_attrs()


# --- the zoo by name -------------------------------------------------------------------------------


def test_zoo_names_are_the_names_zoo_list_prints(capsys):
    names = zoo_names()
    assert [n for n in names if "/" not in n] == [m["name"] for m in zoo.read_manifest()]
    assert [n for n in names if n.startswith("deep/")] == [
        f"deep/{m['name']}" for m in zoo.read_manifest(zoo.DEEP.directory)
    ]
    kept = [f"seeds/{m['name']}" for m in zoo.read_manifest(zoo.SEEDS.directory) if m["file"]]
    assert [n for n in names if n.startswith("seeds/")] == kept  # seed 0 of each variant: its checkpoint
    assert names["seeds/dca.seed0"] == zoo.SEEDS.directory / "dca.seed0.safetensors"
    assert names["denseformer"] == zoo.ZOO_DIR / "denseformer.safetensors"
    assert names["deep/hc"] == zoo.DEEP.directory / "hc.safetensors"
    assert input_kind("denseformer") == input_kind("deep/hc") == "zoo"
    assert main(["zoo", "list", "--collection", "deep"]) == 0
    listing = capsys.readouterr().out
    assert all(n in listing for n in names if n.startswith("deep/"))


def test_a_zoo_name_loads_the_bundled_checkpoint():
    by_name, by_path = depthscope.load("deep/hc"), depthscope.load(zoo.DEEP.directory / "hc.safetensors")
    assert by_name.cfg == by_path.cfg and by_name.cfg.n_layers == 16
    for (k, a), (_, b) in zip(by_name.state_dict().items(), by_path.state_dict().items()):
        assert torch.equal(a, b), k


def test_capture_a_zoo_name_from_the_cli_equals_its_file(tmp_path):
    by_name, by_path = tmp_path / "name.nc", tmp_path / "path.nc"
    assert main(["capture", "denseformer", "--out", str(by_name), *FAST]) == 0
    assert main(["capture", str(zoo.ZOO_DIR / "denseformer.safetensors"), "--out", str(by_path), *FAST]) == 0
    a, b = load_trace(by_name), load_trace(by_path)
    xr.testing.assert_equal(numbers(a), numbers(b))
    assert a.attrs["checkpoint"] == "denseformer" and a.attrs["scheme"] == "denseformer"


@pytest.mark.parametrize(
    "command",
    [
        ["capture", "denseformer", "--out", "{tmp}/t.nc", *FAST],
        ["report", "denseformer", "--out", "{tmp}/r", "--tokens", "128", "--ablate", "off", "--quiet"],
        ["rank", "measure", "denseformer", "--tokens", "128", "--quiet"],
        ["inspect", "denseformer", "--text", "a prompt", "--out", "{tmp}/p.nc"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_a_model_argument_is_parsed_once(tmp_path, monkeypatch, command):
    """Every command parses its model argument once, where it enters (``inputs.ModelRef``), and the
    file a zoo name stands for once: the loaders and the context pre-check take the parsed reference.
    """
    import depthscope.inputs as inputs

    seen: list[str] = []
    parse = inputs._parse

    def counted(path):
        seen.append(str(path))
        return parse(path)

    monkeypatch.setattr(inputs, "_parse", counted)
    argv = [a.format(tmp=tmp_path) for a in command]
    with redirect_stdout(io.StringIO()):
        assert main(argv) == 0
    target = str(zoo.ZOO_DIR / "denseformer.safetensors")
    assert seen.count("denseformer") == 1 and seen.count(target) == 1, seen
    assert set(seen) <= {"denseformer", target}, seen


def test_a_path_on_disk_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    build(tiny()).save(tmp_path / "denseformer")  # a checkpoint file named like a zoo model
    save_llama(tmp_path / "acme" / "tiny", seed=0)  # a model directory named like a hub id
    assert input_kind("denseformer") == "checkpoint"
    assert input_kind("acme/tiny") == "model-dir"
    assert depthscope.load("denseformer").cfg == tiny()


def test_an_unknown_name_is_one_line_saying_what_it_could_be(tmp_path):
    rc, err = run(["capture", "gpt5", "--out", tmp_path / "t.nc", "--quiet"])
    assert_one_error_line(rc, err, "gpt5")
    for word in ("no such file or directory", "smollm2", "depthscope zoo list", "ORG/NAME[@REVISION]"):
        assert word in err
    assert "did you mean" not in err  # nothing is near "gpt5"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("acme/tiny", ("acme/tiny", None)),
        ("acme/tiny@v2", ("acme/tiny", "v2")),
        ("HuggingFaceTB/SmolLM2-135M@refs/pr/1", ("HuggingFaceTB/SmolLM2-135M", "refs/pr/1")),
        ("a.b/c_d-1.5", ("a.b/c_d-1.5", None)),
        ("tiny", None),  # an id needs its organisation here
        ("a/b/c", None),
        ("acme/tiny@", None),
        ("acme/-tiny", None),
        ("acme/ti--ny", None),
        ("acme/ti..ny", None),
        ("/acme/tiny", None),
    ],
)
def test_hub_ids_are_told_from_their_shape(text, parsed):
    assert hub_id(text) == parsed


def test_missing_paths_shaped_like_ids_stay_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for path in ("runs/missing", "acme/model.safetensors", "out/t.nc"):
        with pytest.raises(DepthscopeError, match="no such file or directory"):
            input_kind(path)


# --- Hugging Face hub ids, from the cache --------------------------------------------------------------


def test_capture_by_hub_id_equals_capture_of_its_snapshot(offline, tmp_path):
    by_id, by_dir = tmp_path / "id.nc", tmp_path / "dir.nc"
    assert main(["capture", "acme/tiny", "--out", str(by_id), *FAST]) == 0
    snapshot = offline / "models--acme--tiny" / "snapshots" / MAIN
    assert main(["capture", str(snapshot), "--out", str(by_dir), *FAST]) == 0
    a, b = load_trace(by_id), load_trace(by_dir)
    xr.testing.assert_equal(numbers(a), numbers(b))
    assert a.attrs["hub_id"] == "acme/tiny" and a.attrs["hub_revision"] == MAIN
    assert a.attrs["checkpoint"] == "acme/tiny" and a.attrs["label"] == "tiny"
    assert "hub_id" not in b.attrs
    np.testing.assert_allclose(a["contribution_share"].sum("source"), 1.0, atol=1e-6)


@pytest.mark.parametrize("how", ["at", "option", "commit"])
def test_a_revision_selects_its_snapshot(offline, tmp_path, how):
    args = {
        "at": ["acme/tiny@v2"],
        "option": ["acme/tiny", "--revision", "v2"],
        "commit": [f"acme/tiny@{SECOND}"],
    }[how]
    out, main_out, ref = tmp_path / "v2.nc", tmp_path / "main.nc", tmp_path / "snap.nc"
    assert main(["capture", *args, "--out", str(out), *FAST]) == 0
    assert main(["capture", "acme/tiny", "--out", str(main_out), *FAST]) == 0
    snapshot = offline / "models--acme--tiny" / "snapshots" / SECOND
    assert main(["capture", str(snapshot), "--out", str(ref), *FAST]) == 0
    v2 = load_trace(out)
    assert v2.attrs["hub_revision"] == SECOND and v2.attrs["hub_id"] == "acme/tiny"
    assert v2.attrs["label"] == ("tiny@" + SECOND[:12] if how == "commit" else "tiny@v2")
    xr.testing.assert_equal(numbers(v2), numbers(load_trace(ref)))
    assert not np.allclose(v2["source_rms"], load_trace(main_out)["source_rms"])  # other weights


def test_report_and_rank_take_hub_ids_and_revisions(offline, capsys):
    from depthscope.pipelines.report import ReportSettings, collect
    from depthscope.probes.settings import CaptureSettings

    settings = ReportSettings(capture=CaptureSettings(n_tokens=128, ctx=32))
    [trace], _ = collect([Path("acme/tiny@v2")], settings, progress=False)
    assert trace.attrs["hub_id"] == "acme/tiny" and trace.attrs["hub_revision"] == SECOND
    capsys.readouterr()
    assert main(["rank", "acme/tiny", "--revision", "v2", "--tokens", "512", "--json", "--quiet"]) == 0
    assert '"label": "tiny@v2"' in capsys.readouterr().out


def test_load_a_hub_id_with_a_revision_from_python(offline):
    from transformers import LlamaForCausalLM

    model = depthscope.load("acme/tiny", revision="v2")
    assert model.depthscope_source == {"hub_id": "acme/tiny", "hub_revision": SECOND}
    same = LlamaForCausalLM.from_pretrained(offline / "models--acme--tiny" / "snapshots" / SECOND)
    for (k, a), (_, b) in zip(model.state_dict().items(), same.state_dict().items()):
        assert torch.equal(a, b), k
    trace = capture(model, torch.randint(0, 256, (2, 16)))
    np.testing.assert_allclose(trace["contribution_share"].sum("source"), 1.0, atol=1e-6)


def test_a_hub_id_missing_from_the_cache_is_one_line(offline, tmp_path):
    rc, err = run(["capture", "acme/nothing", "--out", tmp_path / "t.nc", "--quiet"])
    assert_one_error_line(rc, err, "acme/nothing")
    assert "not in the Hugging Face cache" in err and str(offline) in err
    assert "offline" in err and "does not exist" in err
    rc, err = run(["capture", "acme/tiny@v9", "--out", tmp_path / "t.nc", "--quiet"])
    assert_one_error_line(rc, err, "acme/tiny at revision v9")
    assert "cached revisions of it: main, v2" in err
    rc, err = run(["report", "acme/nothing", "--out", tmp_path / "r", "--quiet"])
    assert_one_error_line(rc, err, "acme/nothing")
    rc, err = run(["rank", "acme/nothing"])
    assert_one_error_line(rc, err, "acme/nothing")
    with pytest.raises(DepthscopeError, match="acme/nothing: not in the Hugging Face cache"):
        depthscope.load("acme/nothing")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "args, word",
    [
        (["denseformer", "--revision", "v2"], "--revision"),
        (["acme/tiny@v2", "--revision", "main"], "two revisions"),
        (["acme/tiny", "--revision", " "], "is not a revision"),
    ],
)
def test_revisions_that_cannot_apply_are_one_line(offline, tmp_path, args, word):
    rc, err = run(["capture", *args, "--out", tmp_path / "t.nc", "--quiet"])
    assert_one_error_line(rc, err, word)
    assert not list(tmp_path.iterdir())


def test_a_revision_of_a_local_model_is_refused_from_python():
    with pytest.raises(DepthscopeError, match="revision applies to a Hugging Face hub id"):
        depthscope.load("denseformer", revision="v2")


# --- the download path, against a stand-in for the Hub ----------------------------------------------


class FakeHub:
    """``snapshot_download`` as the Hub would answer it: the cache first; online, a "download" that
    copies a prepared snapshot into the cache (what the real one leaves there), or the error the
    real one raises for an id it cannot find or reach.
    """

    def __init__(self, real, remote: dict[str, Path], reachable: bool = True):
        self.real, self.remote, self.reachable, self.calls = real, remote, reachable, []

    def __call__(self, repo_id, *, revision=None, cache_dir=None, local_files_only=False, **kw):
        from huggingface_hub.utils import are_progress_bars_disabled

        self.calls.append(
            {"repo": repo_id, "local": local_files_only, "bars": not are_progress_bars_disabled(), **kw}
        )
        if local_files_only:
            return self.real(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True, **kw)
        from huggingface_hub.errors import LocalEntryNotFoundError

        if not self.reachable:
            raise LocalEntryNotFoundError("An error happened while trying to locate the files on the Hub")
        if repo_id not in self.remote:
            from huggingface_hub.errors import RepositoryNotFoundError

            raise RepositoryNotFoundError(f"404 Client Error: {repo_id}", response=_Response())
        import shutil

        folder = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
        shutil.copytree(self.remote[repo_id], folder / "snapshots" / MAIN, dirs_exist_ok=True)
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / "main").write_text(MAIN)
        return str(folder / "snapshots" / MAIN)


class _Response:  # what RepositoryNotFoundError reads from an httpx response
    status_code = 404
    headers: dict = {}
    request = None
    url = "https://huggingface.co"

    def json(self):
        return {}


@pytest.fixture
def online(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    remote = tmp_path / "remote"
    save_llama(remote, seed=3)
    fake = FakeHub(huggingface_hub.snapshot_download, {"acme/remote": remote})
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    return fake


def test_online_a_hub_id_missing_from_the_cache_is_downloaded_once(online, tmp_path):
    out = tmp_path / "t.nc"
    assert main(["capture", "acme/remote", "--out", str(out), *FAST]) == 0
    downloads = [c for c in online.calls if not c["local"]]
    assert len(downloads) == 1 and downloads[0]["allow_patterns"] == list(HUB_FILES)
    assert load_trace(out).attrs["hub_revision"] == MAIN
    online.calls.clear()
    assert main(["capture", "acme/remote", "--out", str(tmp_path / "again.nc"), *FAST]) == 0
    assert all(c["local"] for c in online.calls)  # cached now: never the network again


@pytest.mark.parametrize("reachable, words", [(True, "the Hub has no model"), (False, "cannot be reached")])
def test_online_an_id_the_hub_lacks_or_cannot_serve_is_one_line(online, tmp_path, reachable, words):
    online.reachable = reachable
    rc, err = run(["capture", "acme/nothing", "--out", tmp_path / "t.nc", "--quiet"])
    assert_one_error_line(rc, err, "acme/nothing")
    assert words in err and "not in the Hugging Face cache" in err


@pytest.mark.parametrize("quiet", [True, False])
def test_the_download_shows_huggingface_hubs_progress_unless_quiet(online, tmp_path, quiet):
    args = ["--tokens", "128", "--ctx", "32"] + (["--quiet"] if quiet else [])
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        assert main(["capture", "acme/remote", "--out", str(tmp_path / "t.nc"), *args]) == 0
    [download] = [c for c in online.calls if not c["local"]]
    assert download["bars"] is not quiet
