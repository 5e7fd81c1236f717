"""`depthscope capture` and `depthscope dilution` end to end, and their bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from depthscope.analysis.dilution import consumer_table
from depthscope.cli import main
from depthscope.trace import load_trace, save_trace

SMALL = ["--layers", "2", "--d-model", "16", "--heads", "2", "--ctx", "32", "--batch-size", "4", "--quiet"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "m.safetensors"
    assert main(["train", "--scheme", "attnres", "--steps", "10", "--out", str(path), *SMALL]) == 0
    return path


def test_train_capture_dilution(ckpt, tmp_path, capsys):
    out = tmp_path / "t.nc"
    assert (
        main(["capture", str(ckpt), "--out", str(out), "--tokens", "256", "--batch-size", "3", "--quiet"])
        == 0
    )
    trace = load_trace(out)
    assert trace.attrs["scheme"] == "attnres" and trace.attrs["checkpoint"] == str(ckpt)
    assert trace.attrs["tokens"] == 256 and trace.attrs["ctx"] == 32 and "source_spectrum" not in trace
    capsys.readouterr()
    assert main(["dilution", str(out)]) == 0
    printed = capsys.readouterr().out
    table = consumer_table(trace)
    for label in trace["layer"].values:
        assert label in printed
    # the printed embedding shares are the analysis values
    for v in table["embed_share"].values:
        assert f"{v:.3f}" in printed


def test_capture_rank_ctx_and_skip_positions(ckpt, tmp_path):
    out = tmp_path / "r.nc"
    args = [
        "capture",
        str(ckpt),
        "--out",
        str(out),
        "--tokens",
        "256",
        "--ctx",
        "16",
        "--skip-positions",
        "2",
        "--rank",
        "--quiet",
    ]
    assert main(args) == 0
    trace = load_trace(out)
    assert trace.attrs["ctx"] == 16 and trace.attrs["skip_positions"] == 2
    assert trace.attrs["tokens"] == 16 * 14  # 16 windows of 16, the first 2 positions of each left out
    assert trace["source_spectrum"].sizes["component"] == 16
    assert main(["rank", str(out), "--json"]) == 0


def test_dilution_of_stacked_traces(ckpt, tmp_path, capsys):
    from depthscope.trace import stack_traces

    a = tmp_path / "a.nc"
    main(["capture", str(ckpt), "--out", str(a), "--tokens", "64", "--quiet"])
    t = load_trace(a)
    b = t.copy()
    b.attrs["label"] = "copy"
    save_trace(stack_traces([t, b]), tmp_path / "s.nc")
    capsys.readouterr()
    assert main(["dilution", str(tmp_path / "s.nc")]) == 0
    printed = capsys.readouterr().out
    assert "attnres" in printed and "copy" in printed


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d, c: ["capture", str(d / "missing.safetensors")], "no such file"),
        (
            lambda d, c: ["capture", str(_write(d / "bad.safetensors", b"garbage" * 10))],
            "not a safetensors file",
        ),
        (lambda d, c: ["capture", str(_write(d / "bad.dat", b"garbage" * 10))], "neither a checkpoint"),
        (lambda d, c: ["capture", str(c), "--tokens", "16"], "fewer than one context window"),
        (lambda d, c: ["capture", str(c), "--corpus", str(_write(d / "s.txt", b"tiny"))], "too short"),
        (lambda d, c: ["capture", str(c), "--batch-size", "0"], "Invalid value for '--batch-size'"),
        (lambda d, c: ["capture", str(c), "--tokens", "0"], "Invalid value for '--tokens'"),
        (lambda d, c: ["capture", str(c), "--ctx", "0"], "Invalid value for '--ctx'"),
        (lambda d, c: ["capture", str(c), "--ctx", "33"], "between 1 and the model's context 32"),
        (lambda d, c: ["capture", str(c), "--skip-positions", "-1"], "Invalid value for '--skip-positions'"),
        (
            lambda d, c: ["capture", str(c), "--skip-positions", "32"],
            "skip_positions must be between 0 and 31",
        ),
        (lambda d, c: ["capture", str(d)], "nor a Hugging Face model directory"),
    ],
)
def test_capture_bad_input(ckpt, tmp_path, capsys, make, message):
    out = tmp_path / "t.nc"
    rc = main([*make(tmp_path, ckpt), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err
    assert err.strip().count("\n") == 0
    assert not out.exists() and not list(tmp_path.glob(".t.nc*"))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing.nc", "no such trace file"),
        (lambda d: _write(d / "junk.nc", b"\x89HDF junk"), "not a readable netCDF trace"),
        (lambda d: _versioned(d / "v9.nc", 9), "trace format 9"),
        (lambda d: _write(d / "cut.nc", _truncated(d)), "not a readable netCDF trace"),
        (lambda d: _plain_netcdf(d / "plain.nc"), "not a depthscope trace"),
        (lambda d: _versioned(d / "v2.nc", 2), "trace lacks the variable(s) mixing_std"),
    ],
)
def test_dilution_bad_trace(tmp_path, capsys, make, message):
    rc = main(["dilution", str(make(tmp_path))])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.strip().count("\n") == 0


def _write(path, data):
    path.write_bytes(data)
    return path


def _truncated(d):
    from depthscope.probes import capture
    from tests.helpers import build, random_tokens, tiny

    save_trace(capture(build(tiny()), random_tokens(tiny()), progress=False), d / "whole.nc")
    data = (d / "whole.nc").read_bytes()
    return data[: len(data) // 2]


def _plain_netcdf(path):
    xr.Dataset({"a": ("x", [1.0])}).to_netcdf(path)
    return path


def _versioned(path, version):
    ds = xr.Dataset({"mixing": (("layer", "source"), np.ones((1, 1)))}, attrs={"trace_format": version})
    ds.to_netcdf(path)
    return path


def test_dilution_concludes_first_and_shows_one_consumers_sources(ckpt, tmp_path, capsys):
    """The summary comes first (writes below 1/T at the read-out, the most and least diluted, the
    embedding group, the pattern), and --readout / --layer print one consumer's sources with the
    analysis's own numbers; a checkpoint given instead of a trace says to capture it."""
    from depthscope.analysis.dilution import findings, sources_at

    out = tmp_path / "t.nc"
    assert main(["capture", str(ckpt), "--out", str(out), "--tokens", "128", "--quiet"]) == 0
    trace = load_trace(out)
    capsys.readouterr()
    assert main(["dilution", str(out), "--readout"]) == 0
    printed = capsys.readouterr().out
    f = findings(trace)
    head = printed.split("readout: its")[0]
    assert f"{f['below']} of {f['writes']} sublayer writes are below it" in head
    assert f"most diluted {f['most_diluted']}" in head and f"least {f['least_diluted']}" in head
    assert "pattern score (k=2):" in head  # attnres: learned weights, a finding
    view = sources_at(trace, "readout")
    for s in view["source"].values:
        assert f"{float(view['share'].sel(source=s)):.4f}" in printed
    assert main(["dilution", str(out), "--layer", "1.mlp"]) == 0
    assert "1.mlp: its 4 sources" in capsys.readouterr().out
    assert main(["dilution", str(out), "--layer", "nope"]) == 2
    assert "no consumer 'nope'" in capsys.readouterr().err
    assert main(["dilution", str(ckpt)]) == 2
    assert "a model, not a trace: capture it first" in capsys.readouterr().err


def test_a_model_without_a_tokenizer_reads_text_through_the_one_named(tmp_path, capsys):
    """A directory of weights alone (a 193-id word-piece vocabulary, not bytes) is refused in one
    line naming --tokenizer; with --tokenizer DIR its text is that tokenizer's ids, the trace says
    so, and it equals the capture of the ids the tokenizer gives (capture and inspect alike)."""
    import shutil

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from depthscope.probes import capture, inspect
    from depthscope.probes.load import load_model
    from tests.probes.test_bridge import model_dir

    def llama(vocab):
        cfg = LlamaConfig(
            vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        )  # fmt: skip
        return LlamaForCausalLM(cfg)

    with_tok = model_dir(tmp_path / "with", llama)
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(with_tok / name, bare / name)
    out = tmp_path / "t.nc"
    capsys.readouterr()  # what saving the model printed
    capture_args = ["capture", str(bare), "--out", str(out), "--tokens", "128", "--ctx", "32", "--quiet"]
    assert main(capture_args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--tokenizer NAME_OR_DIR" in err and "193 ids" in err
    assert not out.exists()
    assert main([*capture_args, "--tokenizer", str(with_tok)]) == 0
    trace = load_trace(out)
    tok = AutoTokenizer.from_pretrained(with_tok)
    assert trace.attrs["tokenization"] == f"tokenizer with ({type(tok).__name__})"
    again = capture(load_model(bare), None, n_tokens=128, ctx=32, tokenizer=tok, progress=False)
    xr.testing.assert_allclose(trace, again.assign_attrs(trace.attrs), rtol=1e-6)
    assert main(["capture", str(bare), "--out", str(out), "--tokenizer", str(tmp_path / "nowhere")]) == 2
    assert "--tokenizer" in capsys.readouterr().err
    text = "def f(x): return x"
    assert (
        main(
            [
                "inspect",
                str(bare),
                "--text",
                text,
                "--out",
                str(tmp_path / "p.nc"),
                "--tokenizer",
                str(with_tok),
            ]
        )
        == 0
    )
    shown = xr.load_dataset(tmp_path / "p.nc")
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]  # plain text: no [CLS]
    assert shown.sizes["pos"] == ids.shape[1]
    expect = inspect(load_model(bare), ids)
    np.testing.assert_allclose(
        shown["contribution_share"].values, expect["contribution_share"].values, rtol=1e-6
    )
    assert list(shown["token"].values) == tok.convert_ids_to_tokens(ids[0].tolist())
