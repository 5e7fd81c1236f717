"""Fail closed: every silent failure, crash and resource claim found by the hostile audit of d49192e
ends in one line (exit 2; exit 130 with ``interrupted`` on Ctrl-C), with nothing wrong written.

Each test below failed on d49192e (a run that reported success and was not, a traceback, or memory
that followed what a file claimed); the classes of hostile files themselves are in test_hostile.py
and the fuzz of options in test_fuzz_cli.py.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from depthscope.cli import main
from depthscope.errors import DepthscopeError
from depthscope.probes import capture
from depthscope.probes.partial import digest, partial_path
from depthscope.resources import cores
from depthscope.schemes.checkpoint import META_KEY, read_meta
from depthscope.trace import load_trace, save_trace
from tests.helpers import build, tiny
from tests.test_hostile import assert_one_error_line, run, tree

SMALL = ["--layers", "2", "--d-model", "16", "--heads", "2", "--ctx", "32", "--batch-size", "4", "--quiet"]
ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "m.safetensors"
    assert main(["train", "--steps", "2", "--out", str(path), *SMALL]) == 0
    return path


@pytest.fixture(scope="module")
def trace_file(ckpt, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "t.nc"
    assert main(["capture", str(ckpt), "--out", str(path), "--tokens", "64", "--rank", "--quiet"]) == 0
    return path


def with_tensors(ckpt: Path, out: Path, change) -> Path:
    """A copy of the checkpoint with its tensors changed by ``change(dict)`` (metadata kept)."""
    tensors = load_file(str(ckpt))
    change(tensors)
    with open(ckpt, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        meta = json.loads(f.read(n))["__metadata__"]
    save_file(tensors, str(out), metadata=meta)
    return out


# ---- 1. Ctrl-C: exit 130, one line, no half files, the partial state kept ----


def default_sigint() -> None:
    """In a child, before it runs: Ctrl-C back to its default action. A test runner started with
    SIGINT ignored (a background job of a non-interactive shell) would pass that on, and the child
    would then ignore the very interrupt under test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli_process(args: list, cwd: Path) -> subprocess.Popen:
    """``depthscope args`` in its own session (a Ctrl-C reaches the whole group, as in a terminal)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "depthscope", *map(str, args)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_sigint,
    )


def interrupt_when(proc: subprocess.Popen, ready, timeout: float = 240) -> tuple[int, str]:
    """Send SIGINT to the process group once ``ready()`` holds; (exit status, stderr)."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"finished before it could be interrupted: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "never got ready"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


LONG = ["--tokens", "200000", "--batch-size", "1", "--ctx", "32", "--quiet"]


def test_ctrl_c_during_capture_exits_130_and_keeps_the_partial(ckpt, tmp_path):
    out = tmp_path / "t.nc"
    proc = cli_process(["capture", ckpt, "--out", out, "--checkpoint-every", "1", *LONG], tmp_path)
    rc, err = interrupt_when(proc, lambda: partial_path(out).exists())
    assert rc == 130 and err.strip() == "interrupted", err
    assert not out.exists() and partial_path(out).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]  # no half-written file


def test_ctrl_c_during_a_report_leaves_nothing(ckpt, tmp_path):
    proc = cli_process(
        ["report", ckpt, "--out", tmp_path / "rep", "--no-logits", "--ablate", "off", *LONG], tmp_path
    )
    rc, err = interrupt_when(proc, lambda: any(p.name.startswith(".rep.") for p in tmp_path.iterdir()))
    assert rc == 130 and err.strip() == "interrupted", err
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_with_workers_is_one_line(ckpt, tmp_path):
    out = tmp_path / "t.nc"
    if cores() < 2:  # one core: --workers 2 is refused, in one line, before anything starts
        rc, err = run(["capture", ckpt, "--out", out, "--workers", "2", "--quiet"])
        assert_one_error_line(rc, err, "cores")
        return
    args = ["capture", ckpt, "--out", out, "--workers", "2", "--checkpoint-every", "1", *LONG]
    proc = cli_process(args, tmp_path)
    rc, err = interrupt_when(proc, lambda: partial_path(out, 1, 2).exists())
    assert rc == 130 and err.strip() == "interrupted", err  # no worker tracebacks
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")]  # workers' files too


def test_main_returns_130_on_keyboard_interrupt(monkeypatch, capsys):
    import depthscope.cli as cli

    def interrupted(**kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_emit_json", lambda obj: interrupted())
    assert main(["rank", "threshold", "--d", "4", "--kappa", "0.5", "--json"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


# ---- 2-3. NaN, inf and non-floating weights never pass ----


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t["embed.weight"].fill_(3e38), "non-finite"),  # finite float32 that overflows
        (lambda t: t.update({"unembed.weight": t["unembed.weight"].double().fill_(1e300)}), "NaN or Inf"),
        (lambda t: t.update({"unembed.weight": t["unembed.weight"].long()}), "not floating-point"),
        (lambda t: t.update({"unembed.weight": t["unembed.weight"] > 0}), "not floating-point"),
    ],
    ids=["3e38", "1e300-float64", "int64", "bool"],
)
def test_weights_that_are_not_finite_floats_are_refused(ckpt, tmp_path, change, message):
    bad = with_tensors(ckpt, tmp_path / "bad.safetensors", change)
    before = tree(tmp_path)
    rc, err = run(["capture", bad, "--out", tmp_path / "t.nc", "--tokens", "64", "--quiet"])
    assert_one_error_line(rc, err)
    assert message in err and tree(tmp_path) == before


# ---- 5. tampered partial states ----


def partial_of(ckpt: Path, tmp_path: Path) -> Path:
    """A partial state of 2 of the 4 batches of a capture (its forward fails at the third)."""
    from depthscope import load

    model = load(ckpt)
    calls = {"n": 0}

    def fail(module, args):
        calls["n"] += 1
        if calls["n"] > 2:
            raise RuntimeError("stopped")

    handle = model.register_forward_pre_hook(fail)
    partial = tmp_path / "p.partial"
    with pytest.raises(DepthscopeError, match=r"forward failed on batch \d .*RuntimeError: stopped"):
        capture(model, n_tokens=128, ctx=32, batch_size=1, partial=partial, save_every=1)
    handle.remove()
    return partial


def resume(ckpt: Path, partial: Path):
    from depthscope import load

    return capture(load(ckpt), n_tokens=128, ctx=32, batch_size=1, partial=partial, resume=True)


def tamper(partial: Path, change, *, keep_digest: bool = False) -> None:
    with np.load(partial, allow_pickle=False) as f:
        saved = {k: f[k] for k in f.files}
    meta = json.loads(str(saved.pop("meta")))
    state = {k[2:]: v for k, v in saved.items()}
    change(state, meta)
    if not keep_digest:
        meta["digest"] = digest(state, meta)  # a consistent file: the checks of its content must catch it
    arrays = {f"s/{k}": v for k, v in state.items()}
    arrays["meta"] = np.array(json.dumps(meta))
    with open(partial, "wb") as f:
        np.savez(f, **arrays)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s, m: s.pop("acc.sums.dot"), "lacks acc.sums.dot"),
        (lambda s, m: s["acc.sums.mix"].fill(np.nan), "NaN or inf"),
        (lambda s, m: m.update(batches_done=3), "tokens"),
        (lambda s, m: m.update(batches_done=10**6), "batch count"),
        (lambda s, m: s.update({"acc.sums.dot": np.zeros((3, 3))}), "shape"),
    ],
    ids=["missing-key", "nan", "inflated-batches", "batches-beyond-the-run", "wrong-shape"],
)
def test_a_tampered_partial_is_refused(ckpt, tmp_path, change, message):
    partial = partial_of(ckpt, tmp_path)
    tamper(partial, change)
    with pytest.raises(Exception) as err:
        resume(ckpt, partial)
    assert type(err.value).__name__ == "DepthscopeError" and message in str(err.value)


def test_a_partial_changed_after_writing_is_refused(ckpt, tmp_path):
    partial = partial_of(ckpt, tmp_path)
    tamper(partial, lambda s, m: s["acc.sums.dot"].__imul__(1.5), keep_digest=True)
    with pytest.raises(Exception, match="changed after it was written"):
        resume(ckpt, partial)
    untouched = partial_of(ckpt, tmp_path)  # the check refuses only what changed: a partial resumes
    assert resume(ckpt, untouched).attrs["tokens"] == 128


def test_partials_of_another_world_size_are_refused(ckpt, tmp_path):
    out = tmp_path / "t.nc"
    (tmp_path / "t.nc.partial.0-of-2").write_bytes(b"x")
    (tmp_path / "t.nc.partial.1-of-2").write_bytes(b"x")
    rc, err = run(["capture", ckpt, "--out", out, "--tokens", "64", "--resume", "--quiet"])
    assert_one_error_line(rc, err, "t.nc.partial.0-of-2")
    assert "number of ranks" in err and not out.exists()


def quiet_run(argv: list) -> subprocess.CompletedProcess:
    """``depthscope argv`` in a subprocess, its real stderr captured (third-party bars included)."""
    return subprocess.run(
        [sys.executable, "-m", "depthscope", *map(str, argv)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=default_sigint,
    )


def test_a_window_longer_than_the_models_context_is_refused_before_loading(tmp_path):
    """SmolLM2 declares 8192 positions: --ctx 100000 is one line, before the GGUF file is read (no
    progress bars of transformers' GGUF reader on stderr)."""
    res = quiet_run(["capture", "smollm2", "--out", tmp_path / "t.nc", "--ctx", 100000, "--quiet"])
    assert_one_line(res, "--ctx", "8192")
    assert list(tmp_path.iterdir()) == []


def test_resuming_another_models_partial_is_one_line_after_a_quiet_load(ckpt, tmp_path):
    out = tmp_path / "t.nc"
    partial_of(ckpt, tmp_path).rename(partial_path(out))
    args = ["capture", "smollm2", "--out", out, "--resume", "--tokens", 128, "--ctx", 32, "--batch-size", 1]
    res = quiet_run([*args, "--quiet"])
    assert_one_line(res, "partial")
    assert not out.exists() and partial_path(out).exists()  # the other model's partial is kept


def test_a_report_without_out_writes_to_its_default_directory(trace_file, tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "depthscope", "report", str(trace_file), "--quiet"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    html = (tmp_path / "report" / "index.html").read_text()
    assert '<p class="sub">1 model:' in html  # not "1 models"


# ---- 6. outputs that must not be replaced ----


def test_an_output_that_is_the_input_or_not_a_file_is_refused(ckpt, tmp_path):
    copy = tmp_path / "m.safetensors"
    copy.write_bytes(ckpt.read_bytes())
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for out, what in [
        (copy, "is the input"),
        (fifo, "not a regular file"),
        (Path("/dev/null"), "not a regular"),
    ]:
        rc, err = run(["capture", copy, "--out", out, "--tokens", "64", "--quiet"])
        assert_one_error_line(rc, err)
        assert what in err
    assert copy.read_bytes() == ckpt.read_bytes() and fifo.is_fifo() and Path("/dev/null").is_char_device()


def test_an_output_name_too_long_is_one_line(ckpt, tmp_path):
    rc, err = run(["capture", ckpt, "--out", tmp_path / ("a" * 300 + ".nc"), "--tokens", "64", "--quiet"])
    assert_one_error_line(rc, err)
    assert "too long" in err and list(tmp_path.iterdir()) == []


# ---- 7. figure names are unique ----


def test_labels_that_slug_alike_get_their_own_figures(trace_file, tmp_path):
    t = load_trace(trace_file)
    a, b = (
        save_trace(t.assign_attrs(label=label), tmp_path / f"{i}.nc")
        for i, label in enumerate(["m>1", "m<1"])
    )
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "rep"), "--quiet"]) == 0
    models = sorted(p.name for p in (tmp_path / "rep").glob("model-m-1*.png"))
    assert len(models) == 2 and models[0] != models[1]
    page = (tmp_path / "rep" / "index.html").read_text()
    assert all(name in page or name[:-4] in page for name in models)


# ---- traces that crashed a reading command ----


def broken_traces(src: Path, d: Path) -> dict[str, Path]:
    t = load_trace(src)
    out = {
        "empty layer": t.isel(layer=slice(0, 0)),
        "tokens as text": t.assign_attrs(tokens="many"),
        "no layer coordinate": t.drop_vars(["layer", "layer_block"]),
        "infinite share": t.assign(contribution_share=t["contribution_share"].fillna(0) + np.inf),
    }
    paths = {}
    for name, trace in out.items():
        path = d / f"{name.replace(' ', '-')}.nc"
        trace.to_netcdf(path, unlimited_dims=["layer"] if name == "empty layer" else None)
        paths[name] = path
    return paths


@pytest.mark.parametrize("command", ["dilution", "report", "rank"])
def test_broken_traces_are_one_line(trace_file, tmp_path, command):
    for name, path in broken_traces(trace_file, tmp_path).items():
        args = [command, path] + (["--out", tmp_path / "rep", "--quiet"] if command == "report" else [])
        before = tree(tmp_path)
        rc, err = run(args)
        assert_one_error_line(rc, err, path.name)
        assert tree(tmp_path) == before, name


def test_a_trace_in_another_order_of_dims_reads_the_same(trace_file, tmp_path):
    from depthscope.analysis.dilution import summary

    t = load_trace(trace_file)
    flipped = tmp_path / "flipped.nc"
    t.transpose("source", "layer", ...).to_netcdf(flipped)
    back = load_trace(flipped)
    assert back["mixing"].dims == ("layer", "source")
    xr.testing.assert_allclose(summary(back), summary(t))


def test_user_strings_are_text_not_markup(ckpt, trace_file, tmp_path, capsys):
    t = load_trace(trace_file)
    odd = save_trace(t.assign_attrs(label="x[/b]y[bold]"), tmp_path / "odd.nc")
    assert main(["dilution", str(odd)]) == 0
    assert "x[/b]y[bold]" in capsys.readouterr().out
    (tmp_path / "d").mkdir()
    out = tmp_path / "d" / "[/b].nc"
    assert main(["capture", str(ckpt), "--out", str(out), "--tokens", "64", "--quiet"]) == 0
    assert out.is_file() and "[/b].nc" in capsys.readouterr().out


def test_a_zoo_manifest_with_a_text_step_is_one_line(tmp_path):
    from depthscope import zoo

    manifest = json.loads((zoo.ZOO_DIR / zoo.MANIFEST).read_text())
    manifest["models"][1]["trajectory"]["steps"][0] = "250"
    (tmp_path / zoo.MANIFEST).write_text(json.dumps(manifest))
    rc, err = run(["zoo", "list", "--dir", tmp_path])
    assert_one_error_line(rc, err, "manifest")


def test_a_format_1_stack_with_stream_weights_reports(tmp_path):
    """Format 1 did not say which variables each model has: the standard model's row of hc_res is
    all NaN, and its native figure (which crashed) is not drawn; the HC model's is."""
    from depthscope.trace import stack_traces
    from tests.helpers import perturb

    traces = [capture(perturb(build(tiny(s))), n_tokens=64, ctx=32) for s in ("standard", "hc")]
    s = stack_traces(traces).drop_vars(["layer_block", "source_block", "data_variables"])
    s = s.rename({"scheme": "scheme_scheme"}).rename({"model": "scheme"}).assign_attrs(trace_format=1)
    s.to_netcdf(tmp_path / "f1.nc")
    assert main(["report", str(tmp_path / "f1.nc"), "--out", str(tmp_path / "rep"), "--quiet"]) == 0
    assert [p.name for p in (tmp_path / "rep").glob("native-*.png")] == ["native-hc.png"]


# ---- disk full, huge claims, memory ----


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KB tmpfs (needs root and mount; said so when it cannot be made)."""
    d = tmp_path / "full"
    d.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"a disk-full test needs a small tmpfs (root and mount): {res.stderr.decode()[:120]}")
    yield d
    if subprocess.run(["umount", str(d)], capture_output=True).returncode != 0:  # busy: detach it lazily
        subprocess.run(["umount", "-l", str(d)], check=True)


def test_a_full_disk_is_one_line_and_leaves_nothing(ckpt, small_disk):
    cases = [
        (["train", "--steps", "0", "--out", small_disk / "m.safetensors", "--quiet"], "m.safetensors"),
        (["capture", ckpt, "--out", small_disk / "t.nc", "--tokens", "2048", "--rank", "--quiet"], "t.nc"),
        (["report", ckpt, "--out", small_disk / "rep", "--tokens", "64", "--quiet"], "rep"),
    ]
    (small_disk / "filler").write_bytes(b"\0" * 40_000)  # what is left fits none of the outputs
    for args, name in cases:
        rc, err = run(args)
        assert_one_error_line(rc, err, name)
        assert "no space left on device" in err
        assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def limited(argv: list, limit_gb: float = 6.0) -> subprocess.CompletedProcess:
    """``depthscope argv`` in a subprocess whose address space is limited to ``limit_gb``."""

    def limit():
        default_sigint()
        n = int(limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (n, n))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "depthscope", *map(str, argv)],
        preexec_fn=limit,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def assert_one_line(res: subprocess.CompletedProcess, *words: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.stderr[-800:]
    assert all(w in lines[0] for w in words), lines[0]


def test_huge_token_counts_are_refused_before_allocating(ckpt, tmp_path):
    assert_one_line(
        limited(["capture", ckpt, "--out", tmp_path / "t.nc", "--tokens", 10**12, "--quiet"]), "--tokens"
    )
    assert_one_line(
        limited(["capture", ckpt, "--out", tmp_path / "t.nc", "--tokens", 10**9, "--quiet"]), "memory"
    )
    assert not (tmp_path / "t.nc").exists()


def test_a_trace_claiming_huge_dims_is_refused_before_loading(tmp_path):
    path = tmp_path / "claims.nc"
    import netCDF4

    with netCDF4.Dataset(path, "w") as ds:  # 8k x 8k float64 variables, never written: a few KB
        ds.setncattr("trace_format", 2)
        ds.createDimension("layer", 8192)
        ds.createDimension("source", 8192)
        for name in ("mixing", "mixing_std", "contribution_share", "norm_share"):
            ds.createVariable(name, "f8", ("layer", "source"))
    assert path.stat().st_size < 100_000
    assert_one_line(limited(["dilution", path], 2.0), "claim")


def test_a_checkpoint_claiming_a_huge_model_is_refused_before_building(ckpt, tmp_path):
    meta = read_meta(ckpt)
    meta["model"]["d_model"] = 16384
    tensors = load_file(str(ckpt))
    bad = tmp_path / "huge.safetensors"
    save_file(tensors, str(bad), metadata={META_KEY: json.dumps(meta)})
    assert_one_line(limited(["capture", bad, "--out", tmp_path / "t.nc", "--quiet"], 2.0), "shape")


def test_a_torch_file_claiming_a_huge_model_is_refused_before_building(tmp_path):
    pytest.importorskip("deep_cross_attention")
    from tests.probes.adapters.test_torch_files import dca_args

    path = tmp_path / "m.pt"
    torch.save(
        {"family": "deep-cross-attention", "args": {**dca_args(), "dim": 2**17}, "state_dict": {}}, path
    )
    assert_one_line(limited(["capture", path, "--out", tmp_path / "t.nc", "--quiet"], 2.0), "tensors")


def test_more_workers_than_cores_is_refused(ckpt, tmp_path):
    rc, err = run(["capture", ckpt, "--out", tmp_path / "t.nc", "--workers", str(cores() + 62), "--quiet"])
    assert_one_error_line(rc, err)
    assert "cores" in err and list(tmp_path.iterdir()) == []


def test_a_huge_learning_rate_is_one_line(tmp_path):
    rc, err = run(["train", "--lr", "1e300", "--steps", "2", "--out", tmp_path / "m.safetensors", *SMALL])
    assert_one_error_line(rc, err)
    assert "learning rate" in err and list(tmp_path.iterdir()) == []


# ---- a fuzz over trace files, for every command that reads one ----

READERS = [["dilution"], ["rank"], ["report", "--quiet", "--out"]]


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_fuzzed_traces_are_read_or_refused_in_one_line(trace_file, tmp_path_factory, data):
    t = load_trace(trace_file)
    d = tmp_path_factory.mktemp("fuzz")
    edit = data.draw(st.sampled_from(["dims", "dtype", "nan", "attr", "drop", "inf"]), label="edit")
    var = data.draw(st.sampled_from(sorted(map(str, t.data_vars))), label="variable")
    if edit == "dims":
        n = data.draw(st.integers(0, 3), label="layers kept")
        t = t.isel(layer=slice(0, n))
    elif edit == "dtype":
        t[var] = t[var].astype(data.draw(st.sampled_from(["int8", "float16", "U3"]), label="dtype"))
    elif edit == "nan":
        t[var] = t[var] * np.nan
    elif edit == "inf":
        t[var] = t[var] + np.inf
    elif edit == "attr":
        key = data.draw(
            st.sampled_from(["tokens", "ctx", "seed", "skip_positions", "trace_format"]), label="attr"
        )
        t.attrs[key] = data.draw(st.sampled_from(["x", "-1", "1e400", "[1]"]), label="value")
    else:
        t = t.drop_vars(var)
    path = d / "t.nc"
    t.to_netcdf(path, unlimited_dims=["layer"])  # an empty layer dimension can only be stored unlimited
    for words in READERS:
        args = [*words[:1], path, *words[1:]] + ([d / "rep"] if words[0] == "report" else [])
        rc, err = run(args)
        if rc != 0:
            assert_one_error_line(rc, err)
            assert not (d / "rep").exists()


@pytest.mark.parametrize(
    "key, value", [("vocab_size", 20_000_000), ("hidden_size", 10**9), ("num_hidden_layers", 20_000)]
)
def test_a_hugging_face_config_claiming_a_huge_model_is_refused_before_building(tmp_path, key, value):
    """A few kilobytes of weights beside a config.json that claims billions of parameters: refused
    in one line (the meta build counts them), not after transformers' report or a 5 GB allocation."""
    from transformers import LlamaConfig, LlamaForCausalLM

    small = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    LlamaForCausalLM(small).save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, key: value}))
    res = limited(["capture", tmp_path / "m", "--out", tmp_path / "t.nc", "--quiet"], 3.0)
    assert_one_line(res, "parameters", "weights files hold")
    assert not (tmp_path / "t.nc").exists()


def test_the_entry_point_exits_130_when_an_interrupt_escapes_main(monkeypatch, capsys):
    """A second Ctrl-C while the first is handled reaches ``run``: still exit 130 and one line."""
    import signal as sig

    before = sig.getsignal(sig.SIGINT)  # importing the entry point takes Ctrl-C over
    import depthscope.__main__ as entry
    import depthscope.cli as cli

    def interrupted(argv=None):
        raise KeyboardInterrupt

    def leave(status):  # the real one ends the process with os._exit(status): the test runner with it
        raise SystemExit(status)

    monkeypatch.setattr(cli, "main", interrupted)
    monkeypatch.setattr(entry.interrupt, "leave", leave)
    try:
        with pytest.raises(SystemExit) as exit_:
            entry.run()
    finally:
        sig.signal(sig.SIGINT, before)  # run() ignores Ctrl-C once the command is over
    assert exit_.value.code == 130 and capsys.readouterr().err.strip() == "interrupted"


@pytest.mark.parametrize("world, leaves", [("2", True), ("1", False), (None, False)])
def test_a_rank_under_torchrun_leaves_without_the_interpreters_epilogue(monkeypatch, world, leaves):
    """Under torchrun (WORLD_SIZE > 1) a finished rank exits through ``interrupt.leave`` (exit handlers run,
    output flushed, then os._exit with its status), so no C++ destructor at interpreter exit can turn
    a written trace into a failed run; a single process exits as usual."""
    import signal as sig

    before = sig.getsignal(sig.SIGINT)
    import depthscope.__main__ as entry
    import depthscope.cli as cli

    left: list[int] = []

    def leave(status):
        left.append(status)
        raise SystemExit(status)

    monkeypatch.setattr(cli, "main", lambda argv=None: 3)
    monkeypatch.setattr(entry.interrupt, "leave", leave)
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    try:
        with pytest.raises(SystemExit) as exit_:
            entry.run()
    finally:
        sig.signal(sig.SIGINT, before)
    assert exit_.value.code == 3 and left == ([3] if leaves else [])
