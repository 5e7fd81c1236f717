"""The bounded GGUF header reader (``probes/gguf_header``) and its use before any GGUF file is loaded.

A real GGUF file (SmolLM2, from its PyPI wheel) and files written by the gguf package's own writer
parse as the gguf package's ``GGUFReader`` reads them (an oracle independent of the reader). Hostile
headers, built byte by byte here (an array of 2^40 elements, a string of 2^40 bytes, 2^60 keys, a
truncated file, tensor dimensions whose product overflows, nested arrays ...), are refused in one
line naming the file and the claim by the reader, by ``declared_context`` (the pre-check of a
capture), by ``load_gguf`` and by ``depthscope capture``, before the gguf package's reader (which
allocates what a header claims) is reached; one of them in a process whose address space is
limited to 1.5 GB above what the interpreter with torch and the CLI imported maps.
"""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depthscope.errors import DepthscopeError
from depthscope.inputs import resolve_short_name
from depthscope.probes.gguf_header import GGUFArray, read_gguf_header
from depthscope.probes.load import declared_context, load_gguf
from tests.test_fail_closed import ROOT, assert_one_line, limited
from tests.test_hostile import assert_one_error_line, run

gguf = pytest.importorskip("gguf")

HEADROOM = int(1.5 * 2**30)  # what a process may map beyond its start-up while it reads a hostile file
HUGE, HUGER = 2**40, 2**60
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


# --- GGUF bytes, written by hand (little-endian) -------------------------------------------------


def text(value: str | bytes) -> bytes:
    """A GGUF string: uint64 length, then the bytes."""
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return text(key) + struct.pack("<I", vtype) + payload


def array(etype: int, count: int, body: bytes = b"") -> bytes:
    return struct.pack("<IQ", etype, count) + body


def tensor(name: str, dims: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    return text(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset)


GOOD = [
    kv("general.architecture", STR, text("llama")),
    kv("llama.context_length", U32, struct.pack("<I", 2048)),
]


def header(kvs=(), tensors=(), *, base=GOOD, n_kv=None, n_tensors=None, version=3, pad=4000) -> bytes:
    """A GGUF file: the counts (those of the lists unless given), the key/values (``base`` first),
    tensor infos, then ``pad`` zero bytes (a few KB: a hostile file claims far more than it holds)."""
    kvs, tensors = [*base, *kvs], list(tensors)
    n_kv = len(kvs) if n_kv is None else n_kv
    n_tensors = len(tensors) if n_tensors is None else n_tensors
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + b"".join(kvs + tensors) + b"\0" * pad


def nested(depth: int) -> bytes:
    """An array nesting ``depth`` arrays, the innermost one empty."""
    body = array(U8, 0)
    for _ in range(depth - 1):
        body = array(ARR, 1, body)
    return body


# name -> (the file's bytes, what the one line says besides the file's name)
HOSTILE = {
    "an array of 2^40 elements": (header([kv("big", ARR, array(U32, HUGE))]), [str(HUGE), "'big'"]),
    "an array of 2^40 strings": (header([kv("tokens", ARR, array(STR, HUGE))]), [str(HUGE), "'tokens'"]),
    "a string of 2^40 bytes": (header([kv("general.name", STR, struct.pack("<Q", HUGE))]), [str(HUGE)]),
    "a key of 2^40 bytes": (header([struct.pack("<Q", HUGE)], n_kv=3), [str(HUGE), "key 2"]),
    "a string of 2^40 bytes in an array": (
        header([kv("tokens", ARR, array(STR, 2, text("a") + struct.pack("<Q", HUGE)))]),
        [str(HUGE), "'tokens'"],
    ),
    "an array of 2^40 elements in an array": (
        header([kv("n", ARR, array(ARR, 1, array(U8, HUGE)))]),
        [str(HUGE), "'n'"],
    ),
    "2^60 keys": (header(n_kv=HUGER), [str(HUGER), "key/value"]),
    "2^60 tensors": (header(n_tensors=HUGER), [str(HUGER), "tensor"]),
    "a header cut in its counts": (b"GGUF" + struct.pack("<I", 3) + b"\1\0\0", ["tensor count"]),
    "a header cut in a key": (header(pad=0)[:-3], ["'llama.context_length'"]),
    "version 1": (header(version=1), ["version 1"]),
    "version 4": (header(version=4), ["version 4"]),
    "tensor dims whose product overflows": (
        header(tensors=[tensor("w", [2**32, 2**32, 2**32])]),
        ["'w'", "overflows"],
    ),
    "tensor dims whose product wraps to zero in 64 bits": (
        header(tensors=[tensor("w", [2**32, 2**32, 0, 1]), tensor("v", [2**62, 4])]),
        ["'v'", "overflows"],
    ),
    "five tensor dims": (header(tensors=[tensor("w", [1] * 5)]), ["'w'", "5 dimensions"]),
    "tensor data past the end": (header(tensors=[tensor("w", [4096, 4096])]), ["'w'", "67108864 bytes"]),
    "arrays nested 4 deep": (header([kv("deep", ARR, nested(4))]), ["'deep'", "nests arrays"]),
    "arrays nested 1000 deep": (header([kv("deep", ARR, nested(1000))]), ["'deep'", "nests arrays"]),
    "a key that is not UTF-8": (header([text(b"k\xff") + struct.pack("<IB", U8, 0)]), [r"'k\\xff'", "UTF-8"]),
    "an unknown value type": (header([kv("x", 13, b"")]), ["'x'", "value type 13"]),
    "a key twice": (header([GOOD[0]]), ["'general.architecture'", "twice"]),
    "an alignment of 3": (header([kv("general.alignment", U32, struct.pack("<I", 3))]), ["alignment"]),
    "a key with a line break": (header([kv("a\nb", STR, struct.pack("<Q", HUGE))]), [r"'a\nb'"]),
}


def smollm2() -> Path:
    path = resolve_short_name("smollm2")
    assert path.suffix == ".gguf"
    return path


def hostile(tmp_path: Path, case: str) -> Path:
    if case == "a truncated file":  # a real model cut short (an interrupted download)
        data = smollm2().read_bytes()[:100_000]
    else:
        data = HOSTILE[case][0]
    path = tmp_path / "hostile.gguf"
    path.write_bytes(data)
    return path


CASES = [*HOSTILE, "a truncated file"]


def words(case: str) -> list[str]:
    return HOSTILE[case][1] if case in HOSTILE else ["claims"]


def _vm_size() -> int:
    """This process's mapped address space, in bytes."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


@pytest.fixture
def bounded():
    """While the test runs, this process may map at most HEADROOM more (RLIMIT_AS): a reader that
    allocates what a header claims fails the test instead of exhausting the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_size() + HEADROOM
    resource.setrlimit(
        resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard)
    )
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture
def no_gguf_reader(monkeypatch):
    """The gguf package's reader, made to fail loudly: a hostile header must be refused before it."""
    reached = []

    def refuse(self, path, *args, **kwargs):
        reached.append(path)
        raise AssertionError(f"gguf's GGUFReader was given {path}")

    monkeypatch.setattr(gguf.GGUFReader, "__init__", refuse)
    yield reached
    assert not reached, f"gguf's GGUFReader was reached: {reached}"


def assert_refused(err: DepthscopeError, path: Path, case: str) -> None:
    lines = str(err).splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path}: "), str(err)
    assert all(w in lines[0] for w in words(case)), (words(case), lines[0])


# --- hostile headers: one line, before anything is allocated --------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_the_reader_refuses_a_hostile_header_in_one_line(tmp_path, case, bounded):
    path = hostile(tmp_path, case)
    with pytest.raises(DepthscopeError) as err:
        read_gguf_header(path)
    assert_refused(err.value, path, case)


@pytest.mark.parametrize("case", CASES)
def test_declared_context_refuses_a_hostile_header_before_gguf_reads_it(
    tmp_path, case, bounded, no_gguf_reader
):
    path = hostile(tmp_path, case)
    with pytest.raises(DepthscopeError) as err:
        declared_context(path)
    assert_refused(err.value, path, case)


@pytest.mark.parametrize("case", CASES)
def test_load_gguf_refuses_a_hostile_header_before_transformers_reads_it(
    tmp_path, case, bounded, no_gguf_reader
):
    path = hostile(tmp_path, case)
    with pytest.raises(DepthscopeError) as err:
        load_gguf(path)
    assert_refused(err.value, path, case)


@pytest.mark.parametrize("case", CASES)
def test_capture_of_a_hostile_gguf_is_one_line_and_exit_2(tmp_path, case, bounded, no_gguf_reader):
    path, out = hostile(tmp_path, case), tmp_path / "t.nc"
    rc, err = run(["capture", path, "--out", out, "--quiet"])
    assert_one_error_line(rc, err, path.name)
    assert all(w in err for w in words(case)), (words(case), err)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_file_without_the_magic_is_refused(tmp_path, no_gguf_reader):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGML" + header()[4:])
    with pytest.raises(DepthscopeError, match=r"m\.gguf: .*b'GGML', not the magic b'GGUF'"):
        read_gguf_header(path)
    with pytest.raises(DepthscopeError, match="magic"):
        load_gguf(path)
    assert_one_error_line(*run(["capture", path, "--out", tmp_path / "t.nc", "--quiet"]), "m.gguf")
    path.write_bytes(b"GG")
    with pytest.raises(DepthscopeError, match="b'GG', not the magic"):
        read_gguf_header(path)


def test_a_2_40_element_array_is_refused_in_a_process_limited_to_1_5_gb_above_its_start(tmp_path):
    """The CLI in a subprocess whose address space is limited (RLIMIT_AS) to 1.5 GB above what an
    interpreter with torch and the CLI imported maps (measured here: about 2 GB on CPU torch). Before
    the bounded reader, gguf's reader ran out of that memory after seconds, its MemoryError was
    swallowed by the pre-check and transformers' reader failed the load with another message.
    """
    path = tmp_path / "huge.gguf"
    path.write_bytes(HOSTILE["an array of 2^40 elements"][0])
    started = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch, depthscope.cli, depthscope.pipelines.capture; print(open("
            "'/proc/self/status').read())",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    vm_peak = next(int(line.split()[1]) * 1024 for line in started.splitlines() if line.startswith("VmPeak:"))
    res = limited(["capture", path, "--out", tmp_path / "t.nc", "--quiet"], (vm_peak + HEADROOM) / 2**30)
    assert_one_line(res, "huge.gguf", str(HUGE), "'big'")
    assert "MemoryError" not in res.stderr
    assert not (tmp_path / "t.nc").exists()


# --- real and well-formed files read as the gguf package reads them -------------------------------


def test_smollm2_reads_as_ggufs_own_reader_reads_it():
    path = smollm2()
    ours, theirs = read_gguf_header(path), gguf.GGUFReader(path)
    fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.architecture == fields["general.architecture"].contents() == "llama"
    assert ours.context_length == fields["llama.context_length"].contents() == 8192
    assert declared_context(path) == declared_context("smollm2") == 8192
    assert ours.version == theirs.fields["GGUF.version"].contents() == 3
    assert_same(ours, theirs)
    assert len(ours.tensors) == 272
    vocabulary = ours.metadata["tokenizer.ggml.tokens"]
    assert vocabulary == GGUFArray("string", 49152)  # counted and skipped, never built


def assert_same(ours, theirs) -> None:
    """Every key, scalar value, array type and count, tensor info and the data's start agree."""
    fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert list(ours.metadata) == list(fields)
    for key, value in ours.metadata.items():
        field = fields[key]
        if isinstance(value, GGUFArray):
            assert field.types[0] == gguf.GGUFValueType.ARRAY, key
            count = int(field.parts[4][0])  # key length, key, value type, element type, count, ...
            assert value == GGUFArray(field.types[1].name.lower(), count), key
            assert count == len(field.data) or value.element_type == "array", key
        else:
            assert value == field.contents() and type(value) is type(field.contents()), key
    assert [(t.name, list(t.dims), t.ggml_type, ours.data_start + t.offset) for t in ours.tensors] == [
        (t.name, [int(d) for d in t.shape], int(t.tensor_type), t.data_offset) for t in theirs.tensors
    ]
    assert ours.data_start == theirs.data_offset


@pytest.mark.parametrize("endian", ["LITTLE", "BIG"])
def test_every_value_type_reads_as_ggufs_own_reader_reads_it(tmp_path, endian):
    """A file of gguf's own writer (which writes no empty array): each value type, arrays of each,
    nested arrays, strings that are not ASCII, a custom alignment and tensors of several types, in
    either byte order."""
    path = tmp_path / "all.gguf"
    writer = gguf.GGUFWriter(path, "gpt2", endianess=gguf.GGUFEndian[endian])
    writer.add_context_length(1024)
    writer.add_custom_alignment(64)
    v = gguf.GGUFValueType
    scalars = {v.UINT8: 255, v.INT8: -128, v.UINT16: 65535, v.INT16: -32768, v.UINT32: 2**32 - 1}
    scalars |= {v.INT32: -(2**31), v.FLOAT32: 0.5, v.BOOL: True, v.UINT64: 2**64 - 1, v.INT64: -(2**63)}
    scalars |= {v.FLOAT64: 1e300, v.STRING: "héllo\nwörld"}
    for vtype, value in scalars.items():
        writer.add_key_value(f"t.{vtype.name.lower()}", value, vtype)
        writer.add_key_value(f"t.{vtype.name.lower()}s", [value] * 3, v.ARRAY, sub_type=vtype)
    writer.add_array("t.nested", [[1, 2], [3], [["x"], ["y", "z"]]])
    writer.add_tensor("a", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("b", np.arange(5, dtype=np.float16))
    writer.add_tensor("c", np.zeros((2, 3, 4), dtype=np.int8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = read_gguf_header(path)
    assert_same(ours, gguf.GGUFReader(path))
    assert ours.metadata["t.nested"] == GGUFArray("array", 3)
    assert ours.metadata["t.string"] == "héllo\nwörld"
    assert (ours.architecture, ours.context_length, declared_context(path)) == ("gpt2", 1024, 1024)


def test_a_header_without_a_context_length_declares_none(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(header(base=GOOD[:1]))
    assert read_gguf_header(path).metadata == {"general.architecture": "llama"}
    assert declared_context(path) is None


def test_the_vocabulary_is_skipped_not_built():
    """The header of SmolLM2 (two arrays of ~49k strings) is read in far less memory than its
    vocabulary would take as Python strings (a few MB)."""
    import tracemalloc

    read_gguf_header(smollm2())  # the imports it needs, done
    tracemalloc.start()
    try:
        read_gguf_header(smollm2())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 300_000, peak


# --- any damage to a good header: DepthscopeError or a header, never another exception -----------

SMALL = header(
    [kv("tokens", ARR, array(STR, 3, text("a") + text("bc") + text(""))), kv("n", ARR, nested(2))],
    [
        tensor("w", [4, 2]),
        tensor("v", [3], 1, 64),
    ],
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cut=st.integers(0, len(SMALL)),
    edits=st.lists(st.tuples(st.integers(0, len(SMALL) - 1), st.integers(0, 255)), max_size=4),
)
def test_a_damaged_header_is_read_or_refused_in_one_line(tmp_path, bounded, cut, edits):
    data = bytearray(SMALL)
    for at, byte in edits:
        data[at] = byte
    path = tmp_path / "d.gguf"
    path.write_bytes(bytes(data[:cut]))
    try:
        read_gguf_header(path)
    except DepthscopeError as err:
        assert len(str(err).splitlines()) == 1 and str(err).startswith(f"{path}: "), str(err)
