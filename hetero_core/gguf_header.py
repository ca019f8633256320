"""A GGUF file's header: its metadata and where each tensor lies, read in one pass.

The layout (GGUF versions 2 and 3, little-endian)::

    "GGUF"  u32 version  u64 tensor_count  u64 kv_count
    kv_count x   [string key][u32 value type][value]
    tensor_count x [string name][u32 n_dims][u64 dims[n_dims]][u32 ggml type][u64 offset]
    padding to `general.alignment` (32 by default), then the tensors' data,
    each at its offset from that point

    string: u64 byte length, UTF-8 bytes
    array:  u32 item type, u64 count, items

The ``gguf`` package's reader wraps every value of every field in its own
numpy view of a memory map: on a vocabulary of 49,152 tokens and 48,900
merges that took six seconds per start. This reads the same header with
``struct`` (string arrays) and ``numpy.frombuffer`` (numeric arrays) in a
tenth of a second and returns plain Python values. Tensor data is not read
here: the executor maps it from :attr:`GGUFHeader.data_offset`.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import attrs
import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
SCALARS = {  # GGUF value type -> struct format
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
ARRAY_DTYPES = {
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    6: np.float32,
    7: np.bool_,
    10: np.uint64,
    11: np.int64,
    12: np.float64,
}


@attrs.frozen
class TensorInfo:
    """One tensor's entry: ``shape`` in ggml order (innermost dimension first), ``ggml_type`` the
    ``GGMLQuantizationType`` number, ``offset`` in bytes from the start of the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int


@attrs.frozen
class GGUFHeader:
    """Metadata (``fields``: key -> int, float, bool, str or list of them) and tensor entries."""

    path: Path
    version: int
    fields: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_offset: int

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


_LENGTH = struct.Struct("<Q")  # a string's length


class _Cursor:
    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer, self.offset = buffer, 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buffer, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        start, self.offset = self.offset, self.offset + length
        if self.offset > len(self.buffer):
            raise ValueError(f"a string of {length} bytes runs past the end of the file")
        return self.buffer[start : self.offset].decode("utf-8", errors="replace")

    def strings(self, count: int) -> list[str]:
        """``count`` strings one after another, in one loop: a vocabulary holds tens of thousands."""
        buffer, offset, size, length_at = self.buffer, self.offset, len(self.buffer), _LENGTH.unpack_from
        values = []
        for _ in range(count):
            (length,) = length_at(buffer, offset)
            start, offset = offset + 8, offset + 8 + length
            if offset > size:
                raise ValueError(f"a string of {length} bytes runs past the end of the file")
            values.append(buffer[start:offset].decode("utf-8", errors="replace"))
        self.offset = offset
        return values

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item == STRING:
                return self.strings(count)
            if item in ARRAY_DTYPES:
                dtype = np.dtype(ARRAY_DTYPES[item]).newbyteorder("<")
                values = np.frombuffer(self.buffer, dtype, count, self.offset)
                self.offset += values.nbytes
                return values.tolist()
            return [self.value(item) for _ in range(count)]  # arrays of arrays
        if kind not in SCALARS:
            raise ValueError(f"unknown GGUF value type {kind} at byte {self.offset}")
        return self.unpack(SCALARS[kind])


def read_gguf_header(path: Path) -> GGUFHeader:
    """The header of the GGUF file at ``path``; ``ValueError`` for a file that is not GGUF v2/v3 or is cut short."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
        if buffer[:4] != MAGIC:
            raise ValueError(f"{path}: not a GGUF file (magic {bytes(buffer[:4])!r})")
        cursor = _Cursor(buffer)
        cursor.offset = 4
        try:
            version = cursor.unpack("<I")
            if version not in VERSIONS:
                raise ValueError(
                    f"{path}: GGUF version {version} is not supported (only {', '.join(map(str, VERSIONS))})"
                )
            tensor_count, kv_count = cursor.unpack("<Q"), cursor.unpack("<Q")
            fields: dict[str, Any] = {}
            for _ in range(kv_count):
                key = cursor.string()
                fields[key] = cursor.value(cursor.unpack("<I"))
            tensors = []
            for _ in range(tensor_count):
                name = cursor.string()
                dims = tuple(cursor.unpack("<Q") for _ in range(cursor.unpack("<I")))
                tensors.append((name, dims, cursor.unpack("<I"), cursor.unpack("<Q")))
        except struct.error as exc:
            raise ValueError(f"{path}: the GGUF header is cut short ({exc})") from exc
        alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"{path}: general.alignment {alignment!r} is not a power of two")
        data_offset = -(-cursor.offset // alignment) * alignment
    infos = tuple(TensorInfo(name, dims, kind, data_offset + offset) for name, dims, kind, offset in tensors)
    return GGUFHeader(Path(path), version, fields, infos, data_offset)
