"""Hostile and broken files from others: traces, checkpoints, model directories, zoo manifests.

Every command that reads one answers a broken file with exit 2 and one line ``error: ...`` on
stderr (no traceback) and leaves nothing behind; strings from a file reach the HTML report only
escaped; a checkpoint's metadata and a model directory's config are data, never code.
"""

from __future__ import annotations

import contextlib
import io
import json
import struct
from pathlib import Path

import markupsafe
import numpy as np
import pytest
import xarray as xr

from depthscope.cli import main
from depthscope.errors import CheckpointError, TraceError
from depthscope.schemes import load_checkpoint
from depthscope.schemes.checkpoint import META_KEY, read_meta
from depthscope.trace import load_trace, save_trace

SMALL = ["--layers", "2", "--d-model", "16", "--heads", "2", "--ctx", "32", "--batch-size", "4", "--quiet"]
EVIL = "<script>alert(1)</script> \"double\" 'single' & &amp; </code></p><img src=x onerror=alert(2)>"


def run(argv: list[str]) -> tuple[int, str]:
    """(exit status, stderr) of ``depthscope argv``; an exception escaping ``main`` is a traceback."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main([str(a) for a in argv])
        except Exception as exc:  # what a user would see as a traceback
            pytest.fail(f"depthscope {' '.join(map(str, argv))} raised {type(exc).__name__}: {exc}")
    return rc, err.getvalue()


def assert_one_error_line(rc: int, err: str, name: str | None = None) -> None:
    lines = err.splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and lines[0].startswith("error: ") and lines[0][7:].strip(), err
    assert "Traceback" not in err
    if name is not None:
        assert name in lines[0], f"the message does not name the file {name}: {err}"


def tree(root: Path) -> list[str]:
    """Everything under ``root`` (hidden temporaries included), as relative paths."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


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


# --- broken traces -------------------------------------------------------------------------------


def _edited(good: Path, path: Path, edit) -> Path:
    save_trace(edit(load_trace(good)), path)
    return path


def _truncated(good: Path, path: Path) -> Path:
    data = good.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _corrupt(good: Path, path: Path) -> Path:
    rng = np.random.default_rng(0)
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + rng.bytes(8000))  # a valid HDF5 signature, then noise
    return path


def _plain_netcdf(good: Path, path: Path) -> Path:
    xr.Dataset({"temperature": ("time", [1.0, 2.0])}, attrs={"title": "weather"}).to_netcdf(path)
    return path


def _future(good: Path, path: Path) -> Path:
    return _edited(good, path, lambda t: t.assign_attrs(trace_format=3))


def _version_text(good: Path, path: Path) -> Path:
    return _edited(good, path, lambda t: t.assign_attrs(trace_format="two"))


def _without_variable(good: Path, path: Path) -> Path:
    return _edited(good, path, lambda t: t.drop_vars(["contribution_share", "mixing_std"]))


def _without_dimension(good: Path, path: Path) -> Path:
    return _edited(good, path, lambda t: t.rename({"source": "src"}))


def _without_coordinate(good: Path, path: Path) -> Path:
    return _edited(good, path, lambda t: t.drop_vars("source_kind"))


def _variable_without_dimension(good: Path, path: Path) -> Path:
    """``mixing`` holds one number per consumer: its ``source`` dimension is missing."""
    return _edited(good, path, lambda t: t.assign(mixing=t["mixing"].isel(source=0, drop=True)))


def _text_variable(good: Path, path: Path) -> Path:
    return _edited(good, path, lambda t: t.assign(mixing=t["mixing"].astype(str).astype(object)))


def _text_depths(good: Path, path: Path) -> Path:
    return _edited(
        good,
        path,
        lambda t: t.assign_coords(layer_depth=("layer", np.array(["deep"] * t.sizes["layer"], dtype=object))),
    )


def _spectrum_without_component(good: Path, path: Path) -> Path:
    return _edited(good, path, lambda t: t.assign(source_spectrum=t["source_spectrum"].isel(component=0)))


def _format_1_without_mixing(good: Path, path: Path) -> Path:
    xr.Dataset({"weights": (("layer", "source"), np.ones((2, 2)))}, attrs={"trace_format": 1}).to_netcdf(path)
    return path


BROKEN_TRACES = {
    "truncated": _truncated,
    "corrupt": _corrupt,
    "not a trace": _plain_netcdf,
    "future format": _future,
    "format as text": _version_text,
    "missing variables": _without_variable,
    "missing dimension": _without_dimension,
    "missing coordinate": _without_coordinate,
    "variable missing a dimension": _variable_without_dimension,
    "text-valued variable": _text_variable,
    "text-valued depths": _text_depths,
    "spectrum without components": _spectrum_without_component,
    "format 1 without mixing": _format_1_without_mixing,
}
TRACE_COMMANDS = {
    "dilution": lambda path, out: ["dilution", path],
    "report": lambda path, out: ["report", path, "--out", out, "--quiet"],
    "rank": lambda path, out: ["rank", path],
}


@pytest.mark.parametrize("case", list(BROKEN_TRACES))
def test_load_trace_refuses_a_broken_trace(trace_file, tmp_path, case):
    bad = BROKEN_TRACES[case](trace_file, tmp_path / "bad.nc")
    with pytest.raises(TraceError) as info:
        load_trace(bad)
    assert str(bad) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("command", list(TRACE_COMMANDS))
@pytest.mark.parametrize("case", list(BROKEN_TRACES))
def test_every_trace_reader_refuses_a_broken_trace_in_one_line_and_leaves_nothing(
    trace_file, tmp_path, case, command
):
    bad = BROKEN_TRACES[case](trace_file, tmp_path / "bad.nc")
    before = tree(tmp_path)
    rc, err = run(TRACE_COMMANDS[command](bad, tmp_path / "report"))
    assert_one_error_line(rc, err, "bad.nc")
    assert tree(tmp_path) == before  # no output directory, no .report.* or .bad.nc.* temporaries


def test_report_on_a_truncated_trace_creates_no_directories(trace_file, tmp_path):
    bad = _truncated(trace_file, tmp_path / "cut.nc")
    rc, err = run(["report", bad, "--out", tmp_path / "reports" / "today", "--quiet"])
    assert_one_error_line(rc, err, "cut.nc")
    assert tree(tmp_path) == ["cut.nc"]  # not even the parent of the output directory


# --- strings from files reach the report escaped ---------------------------------------------------


def _report_of(trace_file: Path, d: Path, **attrs) -> str:
    t = load_trace(trace_file)
    save_trace(t.assign_attrs(**attrs), d / "evil.nc")
    assert run(["report", d / "evil.nc", "--out", d / "report", "--quiet"])[0] == 0
    return (d / "report" / "index.html").read_text(encoding="utf-8")


def test_report_escapes_every_string_from_a_trace(trace_file, tmp_path):
    strings = ("label", "checkpoint", "config", "corpus", "consumer_input", "variant")
    html = _report_of(trace_file, tmp_path, **{key: EVIL for key in strings})
    assert "<script>alert" not in html and "<img src=x" not in html and "onerror=alert(2)>" not in html
    assert EVIL not in html and 'data-model="<' not in html
    assert str(markupsafe.escape(EVIL)) in html  # the label itself is shown, escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert html.count("<script") == 1 and html.count("</script>") == 1  # the report's own block only
    assert html.index("<script>") > html.index('<h2 id="settings">')


def test_report_draws_a_label_with_dollar_signs_literally(trace_file, tmp_path):
    """A label is text, not matplotlib mathtext: ``$x^$`` must not break the figures."""
    label = "run $x^$ cost $5 \\frac$"
    html = _report_of(trace_file, tmp_path, label=label)
    assert str(markupsafe.escape(label)) in html


# --- checkpoints from others: metadata is data -----------------------------------------------------


def _raw_checkpoint(src: Path, path: Path, metadata=..., edit=None) -> Path:
    """A copy of ``src`` with its safetensors header rewritten by hand: any JSON in ``__metadata__``
    (safetensors itself only writes strings there), and ``edit`` applied to the header.
    """
    data = src.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    if metadata is not ...:
        header["__metadata__"] = metadata
    if edit is not None:
        edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n :])
    return path


def _with_model(**changes):
    def metadata(meta):
        meta["model"].update(changes)
        return {META_KEY: json.dumps(meta)}

    return metadata


def _with_training(training):
    def metadata(meta):
        meta["training"] = training
        return {META_KEY: json.dumps(meta)}

    return metadata


def _first_tensor(header) -> dict:
    return header[next(k for k in header if k != "__metadata__")]


HOSTILE_HEADERS = {
    "metadata is a list": (lambda meta: [1, 2], None),
    "metadata is text": (lambda meta: "__import__('os')", None),
    "metadata is a number": (lambda meta: 7, None),
    "config is a JSON object, not a string": (lambda meta: {META_KEY: meta}, None),
    "config is a number": (lambda meta: {META_KEY: 5}, None),
    "n_layers is 2.5": (_with_model(n_layers=2.5), None),
    "n_layers is 2.0": (_with_model(n_layers=2.0), None),
    "d_model is 16.0": (_with_model(d_model=16.0), None),
    "ctx is 32.5": (_with_model(ctx=32.5), None),
    "ctx is huge": (_with_model(ctx=10**12), None),
    "training is text": (_with_training("<script>alert(1)</script>"), None),
    "training is a list": (_with_training([["step", 1]]), None),
    "training is a number": (_with_training(3), None),
    "data_offsets is text": (..., lambda h: _first_tensor(h).update(data_offsets="ab")),
    "data_offsets is a number": (..., lambda h: _first_tensor(h).update(data_offsets=5)),
    "data_offsets is empty": (..., lambda h: _first_tensor(h).update(data_offsets=[])),
    "data_offsets is an object": (..., lambda h: _first_tensor(h).update(data_offsets={"1": 2})),
}


def _hostile(ckpt: Path, path: Path, case: str) -> Path:
    make, edit = HOSTILE_HEADERS[case]
    metadata = ... if make is ... else make(read_meta(ckpt))
    return _raw_checkpoint(ckpt, path, metadata, edit)


@pytest.mark.parametrize("case", list(HOSTILE_HEADERS))
def test_a_hostile_checkpoint_header_is_a_checkpoint_error(ckpt, tmp_path, case):
    """Every header above is malformed: refused in one line that names the file, never loaded."""
    bad = _hostile(ckpt, tmp_path / "bad.safetensors", case)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(bad)
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("case", list(HOSTILE_HEADERS))
def test_capture_of_a_hostile_checkpoint_exits_2_in_one_line(ckpt, tmp_path, case):
    bad = _hostile(ckpt, tmp_path / "bad.safetensors", case)
    before = tree(tmp_path)
    rc, err = run(["capture", bad, "--out", tmp_path / "t.nc", "--tokens", "32", "--quiet"])
    assert_one_error_line(rc, err, "bad.safetensors")
    assert tree(tmp_path) == before


HOSTILE_TRAINING = {
    "step is text": {"steps": 2, "step": EVIL},
    "step is huge": {"steps": 2, "step": 10**30},
    "step is true": {"step": True},
    "val_loss is an object": {"steps": 2, "val_loss": {"nats": 1.0}},
    "train_tokens is a list": {"steps": 2, "train_tokens": [1, 2]},
}


@pytest.mark.parametrize("case", list(HOSTILE_TRAINING))
def test_hostile_training_metadata_is_refused_or_harmless(ckpt, tmp_path, case):
    """What a checkpoint says about its training flows into traces and reports: it is checked."""
    bad = _raw_checkpoint(
        ckpt, tmp_path / "bad.safetensors", _with_training(HOSTILE_TRAINING[case])(read_meta(ckpt))
    )
    before = tree(tmp_path)
    for argv in (
        ["capture", bad, "--out", tmp_path / "t.nc", "--tokens", "32", "--quiet"],
        ["report", bad, "--out", tmp_path / "report", "--tokens", "32", "--quiet"],
    ):
        rc, err = run(argv)
        if rc != 0:
            assert_one_error_line(rc, err, "bad.safetensors")
            assert tree(tmp_path) == before


def test_strings_in_checkpoint_metadata_run_no_code(ckpt, tmp_path):
    sentinel = tmp_path / "PWNED"
    payload = f"__import__('pathlib').Path({str(sentinel)!r}).touch()"
    meta = read_meta(ckpt)
    meta["training"].update(corpus=EVIL, note=payload, template="{{ 7 * 7 }}{% raw %}")
    metadata = {META_KEY: json.dumps(meta), "code": payload, "pickle": "cos\nsystem\n(S'touch x'\ntR."}
    path = _raw_checkpoint(ckpt, tmp_path / "m.safetensors", metadata)
    model = load_checkpoint(path)
    assert model.training_summary["note"] == payload  # kept as text
    rc, _ = run(["capture", path, "--out", tmp_path / "t.nc", "--tokens", "32", "--quiet"])
    assert rc == 0 and not sentinel.exists()
    assert load_trace(tmp_path / "t.nc").attrs["checkpoint"] == str(path)


# --- Hugging Face directories from others -----------------------------------------------------------


def _hf_dir(d: Path, config, *, weights: bool = True, raw: str | None = None) -> Path:
    """A model directory with ``config`` (and a stand-in weights file: the refusals come first)."""
    path = d / "model"
    path.mkdir()
    (path / "config.json").write_text(raw if raw is not None else json.dumps(config))
    if weights:
        (path / "model.safetensors").write_bytes(b"x")
    return path


LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}


@pytest.mark.parametrize("command", ["report", "rank"])
def test_remote_code_is_refused_by_every_command_that_loads_models(tmp_path, command):
    sentinel = tmp_path / "PWNED"
    path = _hf_dir(tmp_path, {**LLAMA, "auto_map": {"AutoModelForCausalLM": "modeling_evil.Evil"}})
    (path / "modeling_evil.py").write_text(f"import pathlib\npathlib.Path({str(sentinel)!r}).touch()\n")
    before = tree(tmp_path)
    argv = {
        "report": ["report", path, "--out", tmp_path / "report", "--tokens", "64", "--quiet"],
        "rank": ["rank", path, "--tokens", "64", "--quiet"],
    }[command]
    rc, err = run(argv)
    assert_one_error_line(rc, err, "model")
    assert "custom code" in err and not sentinel.exists()
    assert tree(tmp_path) == before


HOSTILE_CONFIGS = {
    "config is a list": dict(raw="[1, 2]"),
    "config is not JSON": dict(raw='{"model_type": "llama",'),
    "model_type is a list": dict(config={**LLAMA, "model_type": ["llama"]}),
    "model_type is an object": dict(config={**LLAMA, "model_type": {"llama": 1}}),
    "architectures is a number": dict(config={**LLAMA, "architectures": 5}),
    "architectures is an object": dict(config={**LLAMA, "architectures": {"x": "LlamaForCausalLM"}}),
}


@pytest.mark.parametrize("case", list(HOSTILE_CONFIGS))
def test_a_hostile_config_json_is_one_line_and_exit_2(tmp_path, case):
    path = _hf_dir(tmp_path, **{"config": None, **HOSTILE_CONFIGS[case]})
    before = tree(tmp_path)
    rc, err = run(["capture", path, "--out", tmp_path / "t.nc", "--quiet"])
    assert_one_error_line(rc, err, "model")
    assert tree(tmp_path) == before


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    """A real (tiny, random) Llama directory without a tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("llama") / "llama"
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def _copy_with_config(src: Path, dst: Path, **changes) -> Path:
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **changes}))
    return dst


def test_nested_auto_map_and_tokenizer_code_never_run(llama_dir, tmp_path):
    sentinel = tmp_path / "PWNED"
    evil = f"import pathlib\npathlib.Path({str(sentinel)!r}).touch()\n"
    nested = _copy_with_config(
        llama_dir, tmp_path / "nested", text_config={"auto_map": {"AutoModelForCausalLM": "evil.M"}}
    )
    (nested / "evil.py").write_text(evil)
    tok = _copy_with_config(llama_dir, tmp_path / "tok")
    (tok / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_evil.T", None]}})
    )
    (tok / "tokenization_evil.py").write_text(evil)
    for path in (nested, tok):
        rc, err = run(
            [
                "capture",
                path,
                "--out",
                tmp_path / f"{path.name}.nc",
                "--ctx",
                "16",
                "--tokens",
                "64",
                "--quiet",
            ]
        )
        if rc != 0:
            assert_one_error_line(rc, err, path.name)
    assert not sentinel.exists()


def test_a_config_with_a_negative_layer_count_is_one_line(llama_dir, tmp_path):
    path = _copy_with_config(llama_dir, tmp_path / "neg", num_hidden_layers=-3)
    rc, err = run(["capture", path, "--out", tmp_path / "t.nc", "--ctx", "16", "--tokens", "64", "--quiet"])
    assert_one_error_line(rc, err, "neg")
    assert not (tmp_path / "t.nc").exists()


# --- model directories whose tokenizer or weights are not the model's ------------------------------


def _saved(path: Path, kind: str) -> Path:
    """A tiny random transformers model of ``kind`` saved alone: no tokenizer files beside it."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    small = dict(
        vocab_size=99, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
    )
    make = {
        "bert": lambda: T.BertForMaskedLM(T.BertConfig(**small, max_position_embeddings=32)),
        "gpt2": lambda: T.GPT2LMHeadModel(
            T.GPT2Config(vocab_size=99, n_embd=16, n_layer=2, n_head=2, n_positions=32)
        ),
        "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**small, max_position_embeddings=32)),
        "qwen2": lambda: T.Qwen2ForCausalLM(T.Qwen2Config(**small, num_key_value_heads=1)),
        "qwen3": lambda: T.Qwen3ForCausalLM(T.Qwen3Config(**small, num_key_value_heads=1, head_dim=8)),
    }[kind]
    make().save_pretrained(path)
    return path


def _capture_refused(path: Path, root: Path, capfd) -> str:
    """`depthscope capture path --out root/t.nc`: exit 2, one line on stderr (transformers' own output
    included: captured at the file descriptors), nothing written under ``root``; the line.
    """
    before = tree(root)
    capfd.readouterr()
    rc = main(["capture", str(path), "--out", str(root / "t.nc"), "--ctx", "16", "--tokens", "64", "--quiet"])
    err = capfd.readouterr().err
    assert_one_error_line(rc, err)
    assert tree(root) == before  # no trace, no temporary
    return err


@pytest.mark.parametrize("kind", ["bert", "gpt2", "gpt_neox", "qwen2", "qwen3"])
def test_a_directory_without_tokenizer_files_asks_for_token_ids_or_a_tokenizer(tmp_path, kind, capfd):
    """transformers 5.24 builds a tokenizer from config.json alone (BERT's reads every word as [UNK],
    the decoders' have no vocabulary): none is used, and text is refused in one line."""
    path = _saved(tmp_path / kind, kind)
    err = _capture_refused(path, tmp_path, capfd)
    assert "no tokenizer" in err and "--tokenizer NAME_OR_DIR" in err
    assert "pass token ids (Python: capture(model, ids))" in err


def test_a_decoder_without_tokenizer_files_reads_bytes_only_with_a_byte_level_vocabulary(tmp_path, capfd):
    """No tokenizer saved and a vocabulary of 1000: its ids are a learned vocabulary's, not the
    corpus's bytes, so text is refused in one line; 300 ids (bytes and special ones, which may come
    first and shift every byte) too; with exactly 256 ids the windows are the corpus's bytes, and the
    trace says so."""
    import transformers as T

    from depthscope.trace import load_trace

    def llama(vocab: int) -> Path:
        cfg = T.LlamaConfig(
            vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32
        )
        T.LlamaForCausalLM(cfg).save_pretrained(tmp_path / f"v{vocab}")
        return tmp_path / f"v{vocab}"

    for vocab in (1000, 300, 257):
        err = _capture_refused(llama(vocab), tmp_path, capfd)
        assert f"no tokenizer and its vocabulary of {vocab} ids is not exactly the 256 bytes" in err
    out = tmp_path / "t.nc"
    assert (
        main(["capture", str(llama(256)), "--out", str(out), "--ctx", "16", "--tokens", "64", "--quiet"]) == 0
    )
    t = load_trace(out)
    assert t.attrs["tokens"] == 4 * 15  # 4 windows of 16 bytes, the first position skipped
    assert t.attrs["tokenization"].startswith("bytes")


def test_a_tokenizer_that_reads_the_corpus_as_one_id_or_as_nothing_is_refused(tmp_path, capfd):
    """Tokenizer files that hold no vocabulary (a BERT tokenizer made with transformers 5.24's ignored
    ``vocab_file=``; GPT-2's built from its config): all [UNK], or no ids at all, is the tokenizer's
    fault, and the message says what to pass instead, not that the corpus is short."""
    from transformers import AutoTokenizer, BertTokenizerFast

    unk = _saved(tmp_path / "unk", "bert")
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]))
    BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt")).save_pretrained(unk)
    err = _capture_refused(unk, tmp_path, capfd)
    assert "to almost one token id (1 is 100.0% of" in err and "pass token ids" in err

    empty = _saved(tmp_path / "empty", "gpt2")
    AutoTokenizer.from_pretrained(empty).save_pretrained(empty)  # the tokenizer built from config.json
    err = _capture_refused(empty, tmp_path, capfd)
    assert "gives no token ids" in err and "pass token ids" in err and "validation split" not in err


def _edit_weights(path: Path, edit) -> Path:
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "model.safetensors")
    save_file(edit(weights), path / "model.safetensors", metadata={"format": "pt"})
    return path


def _without_layer(w: dict) -> dict:
    return {k: v for k, v in w.items() if ".1." not in k}


def _with_extra(w: dict) -> dict:
    import torch

    return {**w, "extra.weight": torch.zeros(3)}


def _misshapen(w: dict) -> dict:
    import torch

    key = next(
        k
        for k in sorted(w)
        if k.endswith("1.attention.output.dense.weight") or k.endswith("1.attn.c_proj.weight")
    )
    return {**w, key: torch.zeros(4, 4)}


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
@pytest.mark.parametrize(
    "edit, says",
    [
        (_without_layer, "missing ("),
        (_with_extra, "1 unexpected (extra.weight)"),
        (_misshapen, "1 mismatched ("),
    ],
    ids=["a layer missing", "an unexpected tensor", "a misshapen tensor"],
)
def test_weights_that_do_not_fit_the_model_are_refused(tmp_path, kind, edit, says, capfd):
    """transformers would initialise the missing (or misshapen) tensors randomly with a multi-line
    warning, and the capture would measure a random layer: one line naming the first keys instead."""
    path = _edit_weights(_saved(tmp_path / kind, kind), edit)
    err = _capture_refused(path, tmp_path, capfd)
    assert "the weights file does not fit" in err and says in err and "random values" in err
    if edit is _without_layer:
        assert ".1." in err.split("missing (")[1]  # names the layer's first keys


# --- a zoo directory from others -------------------------------------------------------------------


@pytest.mark.parametrize(
    "manifest",
    [
        '{"models": [{"name": "x"}]}',
        '{"models": 5}',
        '{"models": [7]}',
        "[]",
        '{"models": [{"name": "<b>x</b>", "scheme": 1, "config": "none"}]}',
    ],
    ids=["entry without fields", "models is a number", "entry is a number", "a list", "fields of odd types"],
)
def test_zoo_list_of_a_hostile_manifest_is_one_line(tmp_path, manifest):
    (tmp_path / "manifest.json").write_text(manifest)
    rc, err = run(["zoo", "list", "--dir", tmp_path])
    assert_one_error_line(rc, err, "manifest.json")
