"""A bounded reader of a GGUF file's header: its metadata and tensor infos, never its weights.

``read_gguf_header(path)`` reads the header forward from the file and checks every count and length
the file claims against the bytes left in it before reading, skipping or allocating anything: a
string of 2^40 bytes, an array of 2^40 elements or 2^60 keys in a file of a few KB is refused at
once, in one line (``DepthscopeError``) that names the file and the claim. Arrays are never built:
their bounds are checked and they are skipped (a tokenizer's vocabulary of 50k strings is walked
length by length, not decoded). The gguf package's own ``GGUFReader`` (which transformers uses)
allocates what a header claims, so a ``.gguf`` file passes here before any reader touches it.

The layout, from the public GGUF specification (ggml's ``docs/gguf.md``), all little-endian (a
big-endian file is told apart by its version number and read as such):

* magic ``GGUF``; version (uint32: 2 or 3); tensor count (uint64); metadata key/value count (uint64);
* per key/value: the key (a string); the value type (uint32); the value. A string is a uint64 byte
  length and that many UTF-8 bytes; an array is an element type (uint32), a uint64 element count and
  the elements (arrays of arrays allowed, here at most ``MAX_ARRAY_DEPTH`` deep);
* per tensor: its name (a string); its number of dimensions (uint32, at most ``MAX_DIMS``); each
  dimension (uint64); its ggml type (uint32); its data offset (uint64), relative to the data, which
  starts at the end of the header rounded up to ``general.alignment`` (default 32, a power of two).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from depthscope.errors import DepthscopeError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ARRAY_DEPTH = 3  # an array of arrays of arrays; ggml itself reads no nested arrays
MAX_DIMS = 4  # GGML_MAX_DIMS: ggml refuses a tensor of more dimensions
MAX_ELEMENTS = 2**63 - 1  # a tensor's element count is an int64 in ggml

# the value types: number -> (name, struct format of a scalar, or "" for a string or an array)
STRING, ARRAY = 8, 9
TYPES = {
    0: ("uint8", "B"),
    1: ("int8", "b"),
    2: ("uint16", "H"),
    3: ("int16", "h"),
    4: ("uint32", "I"),
    5: ("int32", "i"),
    6: ("float32", "f"),
    7: ("bool", "B"),
    STRING: ("string", ""),
    ARRAY: ("array", ""),
    10: ("uint64", "Q"),
    11: ("int64", "q"),
    12: ("float64", "d"),
}
# the fewest bytes one value of a type takes: a string's length, an array's type and count
LEAST_STRING, LEAST_ARRAY = 8, 12
LEAST_KV = 8 + 4 + 1  # an empty key, a value type, a one-byte value
LEAST_TENSOR = 8 + 4 + 4 + 8  # an empty name, no dimensions, a type, an offset


@dataclass(frozen=True)
class GGUFArray:
    """An array value of the metadata, as its element type and count (its elements are skipped)."""

    element_type: str
    count: int


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor's info: its name, dimensions (as the file lists them), ggml type and data offset."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF header holds: its version, its metadata (arrays as ``GGUFArray``) and tensor infos."""

    version: int
    metadata: dict[str, Any]
    tensors: tuple[GGUFTensor, ...] = field(default=())
    data_start: int = 0

    @property
    def architecture(self) -> str | None:
        """``general.architecture`` (the model family, e.g. ``llama``), or None."""
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    @property
    def context_length(self) -> int | None:
        """``ARCH.context_length`` (else the first ``*.context_length`` key), if an integer; or None."""
        keys = [f"{self.architecture}.context_length"] if self.architecture else []
        keys += [k for k in self.metadata if k.endswith(".context_length")]
        value = next((self.metadata[k] for k in keys if k in self.metadata), None)
        return value if type(value) is int else None


def _quote(text: str) -> str:
    """A name from the file, quoted on one line (escapes for line breaks and controls), cut to 80."""
    return repr(text if len(text) <= 80 else text[:77] + "...")


class _Header:
    """The file read forward; every claimed size checked against the bytes left before it is read."""

    def __init__(self, f: BinaryIO, path: Path, size: int) -> None:
        self.f, self.path, self.size, self.pos = f, path, size, 0
        self.order = "<"

    def refuse(self, what: str) -> DepthscopeError:
        """The one-line error for this file."""
        return DepthscopeError(f"{self.path}: not a readable GGUF file: {what}")

    def claim(self, n: int, what: str, least: bool = False) -> None:
        """Refuse a claim of ``n`` bytes (or more, if ``least``) that the rest of the file cannot hold."""
        left = self.size - self.pos
        if n > left:
            raise self.refuse(f"{what} claims {'at least ' * least}{n} bytes and {left} are left in the file")

    def take(self, n: int, what: str) -> bytes:
        """The next ``n`` bytes (a claim checked first)."""
        self.claim(n, what)
        data = self.f.read(n)
        if len(data) != n:  # the file shrank while being read
            raise self.refuse(f"{what}: the file ends early")
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        """Move past ``n`` bytes (a claim checked first), reading none of them."""
        self.claim(n, what)
        self.f.seek(n, 1)
        self.pos += n

    def scalar(self, fmt: str, what: str) -> Any:
        """One number of struct format ``fmt``."""
        return struct.unpack(self.order + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        """A length-prefixed UTF-8 string (bytes that are not UTF-8 replaced)."""
        n = self.scalar("Q", f"the length of {what}")
        return self.take(n, f"{what} (a string)").decode("utf-8", errors="replace")

    def value_type(self, what: str) -> int:
        """A value type, refused unless it is one of the spec's."""
        number = self.scalar("I", f"the type of {what}")
        if number not in TYPES:
            raise self.refuse(f"{what} has value type {number}, not one of GGUF's (0 to 12)")
        return number

    def value(self, kind: int, what: str) -> Any:
        """A metadata value of type ``kind``: a number, a bool, a string or a ``GGUFArray``."""
        if kind == STRING:
            return self.string(what)
        if kind == ARRAY:
            return self.array(what, 1)
        number = self.scalar(TYPES[kind][1], what)
        return bool(number) if TYPES[kind][0] == "bool" else number

    def array(self, what: str, depth: int) -> GGUFArray:
        """Check an array's claims and move past its elements, building none of them."""
        if depth > MAX_ARRAY_DEPTH:
            raise self.refuse(f"{what} nests arrays more than {MAX_ARRAY_DEPTH} deep")
        kind = self.value_type(f"the elements of {what}")
        name, fmt = TYPES[kind]
        count = self.scalar("Q", f"the element count of {what}")
        least = {STRING: LEAST_STRING, ARRAY: LEAST_ARRAY}.get(kind) or struct.calcsize(fmt)
        self.claim(count * least, f"{what}, an array of {count} {name} elements,", kind in (STRING, ARRAY))
        if kind == STRING:
            for _ in range(count):
                self.skip(self.scalar("Q", f"a string's length in {what}"), f"a string in {what}")
        elif kind == ARRAY:
            for _ in range(count):
                self.array(what, depth + 1)
        else:
            self.skip(count * least, what)
        return GGUFArray(name, count)

    def metadata(self, count: int) -> dict[str, Any]:
        """``count`` key/value pairs, keys unique."""
        out: dict[str, Any] = {}
        for i in range(count):
            raw = self.take(self.scalar("Q", f"the length of key {i}"), f"key {i}")
            try:
                key = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise self.refuse(
                    f"key {i} is not UTF-8 ({_quote(raw.decode('utf-8', 'backslashreplace'))})"
                ) from None
            what = f"the value of key {_quote(key)}"
            if key in out:
                raise self.refuse(f"key {_quote(key)} appears twice")
            out[key] = self.value(self.value_type(what), what)
        return out

    def tensor(self, i: int) -> GGUFTensor:
        """One tensor's info, its dimensions' product checked to fit an int64."""
        name = self.string(f"the name of tensor {i}")
        what = f"tensor {_quote(name)}"
        n_dims = self.scalar("I", f"the number of dimensions of {what}")
        if n_dims > MAX_DIMS:
            raise self.refuse(f"{what} claims {n_dims} dimensions (ggml reads at most {MAX_DIMS})")
        self.claim(8 * n_dims + 12, f"the dimensions, type and offset of {what}")
        dims = tuple(self.scalar("Q", f"a dimension of {what}") for _ in range(n_dims))
        elements = 1
        for d in dims:
            elements *= d
        if elements > MAX_ELEMENTS:
            raise self.refuse(f"{what} claims dimensions {list(dims)}, whose product overflows an int64")
        return GGUFTensor(name, dims, self.scalar("I", f"the type of {what}"), self.scalar("Q", what))


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """A GGUF file's header, every size it claims checked against the file (DepthscopeError if not)."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            reader = _Header(f, path, path.stat().st_size)
            return _read(reader)
    except OSError as err:
        raise DepthscopeError(f"{path}: cannot read the GGUF file: {err.strerror or err}") from None


def _read(r: _Header) -> GGUFHeader:
    """The header from the start of the file (magic, version, counts, metadata, tensor infos)."""
    magic = r.take(min(4, r.size), "the magic number")
    if magic != MAGIC:
        raise r.refuse(f"it starts with {magic!r}, not the magic {MAGIC!r}")
    raw = r.take(4, "the version")
    version = int.from_bytes(raw, "little")
    if version not in VERSIONS and int.from_bytes(raw, "big") in VERSIONS:
        r.order, version = ">", int.from_bytes(raw, "big")  # a big-endian file
    if version not in VERSIONS:
        raise r.refuse(f"version {version} (this reader reads versions {VERSIONS[0]} and {VERSIONS[1]})")
    n_tensors = r.scalar("Q", "the tensor count")
    n_kv = r.scalar("Q", "the metadata key/value count")
    r.claim(
        n_kv * LEAST_KV + n_tensors * LEAST_TENSOR,
        f"the header, of {n_kv} metadata key/value pairs and {n_tensors} tensor infos,",
        least=True,
    )
    metadata = r.metadata(n_kv)
    tensors = tuple(r.tensor(i) for i in range(n_tensors))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise r.refuse(f"general.alignment is {alignment!r}, not a power of two")
    data_start = -(-r.pos // alignment) * alignment
    _check_data(r, tensors, data_start)
    return GGUFHeader(version, metadata, tensors, data_start)


def _check_data(r: _Header, tensors: tuple[GGUFTensor, ...], data_start: int) -> None:
    """Refuse a tensor whose data lies past the file's end (an unknown type: one bit per element)."""
    sizes = _quant_sizes()
    held = r.size - data_start
    for t in tensors:
        elements = 1
        for d in t.dims:
            elements *= d
        block, per_block = sizes.get(t.ggml_type, (8, 1))
        need = -(-elements // block) * per_block
        if t.offset + need > held:
            raise r.refuse(
                f"tensor {_quote(t.name)} ({list(t.dims)}, ggml type {t.ggml_type}) claims {need} bytes at "
                f"offset {t.offset} and the file holds {max(held, 0)} bytes of tensor data"
            )


def _quant_sizes() -> dict[int, tuple[int, int]]:
    """Elements and bytes per block of each ggml type, as the gguf package reads them (none without it)."""
    try:
        from gguf.constants import GGML_QUANT_SIZES
    except ImportError:
        return {}
    return {int(k): (int(b), int(s)) for k, (b, s) in GGML_QUANT_SIZES.items()}
