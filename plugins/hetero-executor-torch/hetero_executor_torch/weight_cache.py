"""A disk cache of a GGUF file's weights as the model holds them: decoded, packed for this CPU's kernels.

Building the weights reads every tensor, decodes its blocks and lays them out
for the kernels: seconds for a 0.5B file, tens of seconds for a 3B one. The
result depends only on the file's bytes and on how it was built, so it is
kept on disk and read back on later starts.

- **Key.** A hash (xxh3-128) of the file's bytes, of the build's settings
  (:func:`build_settings`: weight format, dtype, dense copy, the CPU kernels
  that run here, library versions) and of the source of the packages that
  read and lay out weights (the core, this executor, the kernels). A change
  to any of them is a new entry. Reading a file to hash it takes seconds for
  a large one, so its hash is remembered beside the entries under the file's
  identity (path, device, inode, size, modification and change times): a
  file changed in any way, even rewritten in place with its old
  modification time, has another change time and is read again.
- **Entry.** One file: a fixed header, a JSON table, the object structure, then
  each array 64-byte aligned::

      magic (16 bytes) | table length (8, little-endian) | table (JSON: arrays, lengths, checksum)
      | structure (JSON: the objects, their arrays as references into the table) | padding | arrays...

  The structure is JSON, not a pickle: reading it makes only the classes of
  this executor's ``model`` and ``quantized`` modules (``__new__``, then their
  state) and names only the kernels' functions, and calls nothing else the
  entry names. An entry is read by mapping it copy-on-write: its arrays are
  views of the page cache's pages, never copied, resident only where used
  (an embedding table's unused rows are not). Reading checks every length
  and a checksum (xxh3-128) over the structure and the arrays, read from the
  file rather than through the mapping; an entry that fails is deleted and
  rebuilt.
- **Concurrent starts.** Entries are written to a temporary file and renamed
  into place: two starts building one entry at once both succeed, and a reader
  never sees a partial entry.
- **Bounded.** After each write the least recently read entries go until the
  directory holds at most ``max_bytes``; an entry larger than that is not kept.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import json
import mmap
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, TypeVar

import attrs
import numpy as np
import torch
import xxhash

from hetero_core.logs import get_logger

log = get_logger(__name__)
T = TypeVar("T")

MAGIC = b"hetero-weights\x00\x02"
ALIGN = 64
SUFFIX = ".weights"
CACHE_ENV = "HETERO_WEIGHT_CACHE"  # "off", or the directory to use instead of the user cache directory
STALE_TEMPORARY_SECONDS = 3600.0  # a temporary file this old was left by a start that died
DIGEST_SUFFIX = ".digest"  # a file's remembered hash
STALE_DIGEST_SECONDS = 30 * 86400.0  # a remembered hash not read for this long is deleted
_CHUNK = 1 << 24
_SOURCE_PACKAGES = ("hetero_core", "hetero_executor_torch", "hetero_kernels")
_CLASS_MODULES = ("hetero_executor_torch.model", "hetero_executor_torch.quantized")  # the classes an entry may make
_KERNEL_PREFIX = "hetero_kernels."  # the modules whose functions an entry may name


class CorruptEntry(Exception):
    """An entry that cannot be read back as it was written."""


def default_directory() -> Path | None:
    """``$HETERO_WEIGHT_CACHE`` (None where it is ``off``), else the user cache directory's ``hetero-infer/weights``."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen == "off" else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hetero-infer" / "weights"


@functools.cache
def _source_digest() -> str:
    """A hash of every module that decides how weights are laid out (this package and the kernels)."""
    digest = xxhash.xxh3_128()
    for package in _SOURCE_PACKAGES:
        module = sys.modules.get(package) or __import__(package)
        for path in sorted(Path(module.__file__).parent.glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def open_cache(option: str, max_gib: float) -> WeightCache | None:
    """The cache the executor option names: ``auto`` (:func:`default_directory`), ``off``, or a directory."""
    directory = default_directory() if option == "auto" else None if option == "off" else Path(option)
    return None if directory is None else WeightCache(directory, int(max_gib * 2**30))


def file_digest(path: Path) -> str:
    """xxh3-128 of a file's bytes, read in chunks (no mapping, so no resident pages are left behind)."""
    digest = xxhash.xxh3_128()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb") as file:
        while count := file.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()


def build_settings(**settings: Any) -> dict[str, Any]:
    """What a build depends on besides the file: the caller's settings plus library versions and byte order."""
    versions = {name: importlib.metadata.version(name) for name in ("torch", "numpy", "gguf", "numba")}
    return {**settings, **versions, "byteorder": sys.byteorder}


@attrs.frozen
class WeightCache:
    """Entries under ``directory``, at most ``max_bytes`` in all."""

    directory: Path
    max_bytes: int

    def key(self, model: Path, settings: Mapping[str, Any]) -> str:
        digest = xxhash.xxh3_128()
        digest.update(self.content_digest(model).encode())
        digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
        digest.update(_source_digest().encode())
        return digest.hexdigest()

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def content_digest(self, model: Path) -> str:
        """:func:`file_digest` of ``model``, remembered under the file's identity (see the module docstring)."""
        stat = model.stat()
        fields = (model.resolve(), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        memo = self.directory / f"{xxhash.xxh3_128('|'.join(map(str, fields)).encode()).hexdigest()}{DIGEST_SUFFIX}"
        with contextlib.suppress(OSError, UnicodeDecodeError):
            remembered = memo.read_text()
            if len(remembered) == 32 and all(c in "0123456789abcdef" for c in remembered):
                with contextlib.suppress(OSError):
                    os.utime(memo)
                return remembered
        digest = file_digest(model)
        with contextlib.suppress(OSError):  # a read-only cache reads the file again next time
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.directory, suffix=".tmp", delete=False) as file:
                file.write(digest)
            os.replace(file.name, memo)
        return digest

    def load(self, key: str) -> Any | None:
        """The objects stored under ``key``, or None where there is no entry; a corrupt entry is deleted."""
        path = self.path(key)
        try:
            with open(path, "rb") as file:  # mapped copy-on-write: pages come from the page cache, never copied
                mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
                objects = read_entry(mapped, file)
        except FileNotFoundError:
            return None
        except Exception as exc:  # whatever the bytes say, a bad entry is rebuilt, never trusted
            log.warning(
                "weight cache entry is corrupt; rebuilding it", entry=str(path), problem=f"{type(exc).__name__}: {exc}"
            )
            with contextlib.suppress(OSError):  # a read-only cache keeps it; the weights are built all the same
                path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):  # read-only, or evicted meanwhile by another start: nothing to mark
            os.utime(path)  # the least recently read entries are evicted first
        return objects

    def store(self, key: str, objects: Any) -> None:
        """Write ``objects`` under ``key`` (atomically), then evict down to ``max_bytes``; a failure only logs: the
        weights are built already, and a start never fails for want of a cache entry."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                dir=self.directory, prefix=f".{key}.", suffix=".tmp", delete=False
            ) as file:
                temporary = Path(file.name)
                try:
                    write_entry(file, objects, self.max_bytes)
                    file.flush()
                except BaseException:
                    temporary.unlink(missing_ok=True)
                    raise
            os.replace(temporary, self.path(key))
            self.evict(keep=key)
        except Exception as exc:  # a full disk, a read-only directory, an object that cannot be stored
            problem = f"{type(exc).__name__}: {exc}"
            log.warning("weight cache entry not written", directory=str(self.directory), problem=problem)

    def evict(self, keep: str | None = None) -> None:
        """Delete the least recently read entries (never ``keep``) until the rest fit ``max_bytes``,
        stale temporaries and remembered hashes."""
        entries, now = [], time.time()
        for path in self.directory.iterdir():
            try:
                stat = path.stat()
            except FileNotFoundError:  # another start evicted it
                continue
            if path.suffix == SUFFIX:
                entries.append((stat.st_mtime, stat.st_size, path))
            elif path.suffix == ".tmp" and now - stat.st_mtime > STALE_TEMPORARY_SECONDS:
                path.unlink(missing_ok=True)
            elif path.suffix == DIGEST_SUFFIX and now - stat.st_mtime > STALE_DIGEST_SECONDS:
                path.unlink(missing_ok=True)
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if path != (None if keep is None else self.path(keep)):
                path.unlink(missing_ok=True)
                total -= size


def load_or_build(cache: WeightCache | None, model: Path, settings: Mapping[str, Any], build: Callable[[], T]) -> T:
    """``build()``'s objects, read from ``cache`` where an entry for ``model`` and ``settings`` exists,
    else built and stored."""
    if cache is None:
        return build()
    started = time.perf_counter()
    key = cache.key(model, build_settings(**settings))
    objects = cache.load(key)
    if objects is not None:
        log.info(
            "weights read from the cache", entry=str(cache.path(key)), seconds=round(time.perf_counter() - started, 2)
        )
        return objects
    objects = build()
    cache.store(key, objects)
    return objects


class _Encoder:
    """The objects as JSON: arrays and tensors as references into the entry's table, kernels by name, objects of
    the allowed classes by class name and state; anything else cannot be cached."""

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []
        self.table: list[dict[str, Any]] = []
        self._arrays: dict[int, int] = {}
        self._objects: dict[int, int] = {}
        self._alive: list[Any] = []  # keeps every object seen alive, so its id stays its own

    def _array(self, obj: Any, array: np.ndarray, record: dict[str, Any]) -> int:
        index = self._arrays.get(id(obj))
        if index is None:
            index = self._arrays[id(obj)] = len(self.arrays)
            self._alive.append(obj)
            self.arrays.append(np.ascontiguousarray(array))
            self.table.append(record)
        return index

    def encode(self, obj: Any) -> Any:
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                raise TypeError("cannot cache an array of Python objects")
            record = {"kind": "array", "dtype": obj.dtype.str, "shape": list(obj.shape)}
            return {"array": self._array(obj, obj, record)}
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "cpu" or obj.layout != torch.strided:
                raise TypeError(f"cannot cache a {obj.layout} tensor on {obj.device}")
            raw = obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
            record = {"kind": "tensor", "dtype": str(obj.dtype).removeprefix("torch."), "shape": list(obj.shape)}
            return {"tensor": self._array(obj, raw, record)}
        if isinstance(obj, torch.dtype):
            return {"dtype": str(obj).removeprefix("torch.")}
        if isinstance(obj, torch.Size):
            return {"size": list(obj)}
        if isinstance(obj, (tuple, list)):
            return {type(obj).__name__: [self.encode(item) for item in obj]}
        if isinstance(obj, dict) and all(isinstance(key, str) for key in obj):
            return {"dict": {key: self.encode(value) for key, value in obj.items()}}
        kernel = getattr(obj, "py_func", obj)  # a compiled kernel, or a plain function
        if callable(obj) and getattr(kernel, "__module__", "").startswith(_KERNEL_PREFIX):
            return {"function": f"{kernel.__module__}:{kernel.__qualname__}"}
        if type(obj).__module__ in _CLASS_MODULES:
            index = self._objects.get(id(obj))
            if index is not None:
                return {"ref": index}
            self._objects[id(obj)] = len(self._objects)
            self._alive.append(obj)
            state = obj.__getstate__()
            return {"object": f"{type(obj).__module__}:{type(obj).__qualname__}", "state": self.encode(state)}
        raise TypeError(f"cannot cache a {type(obj).__module__}.{type(obj).__qualname__}")


def _named(text: Any, modules: Callable[[str], bool]) -> tuple[str, Any]:
    """The attribute ``module:name`` names, where ``modules(module)`` allows it and ``name`` is defined there."""
    if not isinstance(text, str) or text.count(":") != 1:
        raise CorruptEntry(f"not a name: {text!r}")
    module, name = text.split(":")
    if not modules(module) or not name.isidentifier():
        raise CorruptEntry(f"the structure names {text}, which a weight cache never holds")
    return module, getattr(importlib.import_module(module), name, None)


class _Decoder:
    """The objects back from their JSON; only the allowed classes are made (``__new__``, then their state), and
    nothing named in the entry is ever called but their ``__setstate__``."""

    def __init__(self, arrays: list[np.ndarray], table: list[dict[str, Any]]) -> None:
        self.arrays, self.table = arrays, table
        self.objects: list[Any] = []

    def decode(self, node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if not isinstance(node, dict) or len(node) != 1 and "object" not in node:
            raise CorruptEntry(f"not a node: {str(node)[:80]}")
        match node:
            case {"array": int(index)} if 0 <= index < len(self.arrays) and self.table[index]["kind"] == "array":
                return self.arrays[index]
            case {"tensor": int(index)} if 0 <= index < len(self.arrays) and self.table[index]["kind"] == "tensor":
                return self._tensor(index)
            case {"dtype": str(name)} if isinstance(getattr(torch, name, None), torch.dtype):
                return getattr(torch, name)
            case {"size": list(items)} if all(type(item) is int for item in items):
                return torch.Size(items)
            case {"tuple": list(items)}:
                return tuple(self.decode(item) for item in items)
            case {"list": list(items)}:
                return [self.decode(item) for item in items]
            case {"dict": dict(items)}:
                return {key: self.decode(value) for key, value in items.items()}
            case {"ref": int(index)} if 0 <= index < len(self.objects):
                return self.objects[index]
            case {"function": name}:
                module, function = _named(name, lambda module: module.startswith(_KERNEL_PREFIX))
                if (
                    not callable(function)
                    or getattr(getattr(function, "py_func", function), "__module__", "") != module
                ):
                    raise CorruptEntry(f"{name} is no kernel of {module}")
                return function
            case {"object": name, "state": state}:
                module, cls = _named(name, lambda module: module in _CLASS_MODULES)
                if not isinstance(cls, type) or cls.__module__ != module:
                    raise CorruptEntry(f"{name} is no class of {module}")
                obj = cls.__new__(cls)
                self.objects.append(obj)
                state = self.decode(state)
                if hasattr(obj, "__setstate__"):
                    obj.__setstate__(state)
                elif isinstance(state, dict):
                    obj.__dict__.update(state)
                elif state is not None:
                    raise CorruptEntry(f"a {name} with state {str(state)[:80]}")
                return obj
        raise CorruptEntry(f"not a node: {str(node)[:80]}")

    def _tensor(self, index: int) -> torch.Tensor:
        record = self.table[index]
        dtype = getattr(torch, record["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise CorruptEntry(f"not a torch dtype: {record['dtype']!r}")
        raw = self.arrays[index]
        if raw.size == 0:
            return torch.empty(record["shape"], dtype=dtype)
        return torch.from_numpy(raw).view(dtype).reshape(record["shape"])


def _padding(offset: int) -> int:
    return -offset % ALIGN


def write_entry(file: Any, objects: Any, max_bytes: int | None = None) -> int:
    """Write one entry of ``objects`` to ``file``; its size in bytes. An entry over ``max_bytes`` is an
    ``OSError``, before anything is written."""
    writer = _Encoder()
    structure = json.dumps(writer.encode(objects)).encode()
    checksum = xxhash.xxh3_128(structure)
    offset = 0
    for record, array in zip(writer.table, writer.arrays, strict=True):
        offset += _padding(offset)
        record.update(offset=offset, nbytes=array.nbytes)
        offset += array.nbytes
        checksum.update(memoryview(array).cast("B"))
    table = json.dumps(
        {"arrays": writer.table, "structure": len(structure), "data": offset, "checksum": checksum.hexdigest()}
    ).encode()
    head = MAGIC + len(table).to_bytes(8, "little") + table + structure
    size = len(head) + _padding(len(head)) + offset
    if max_bytes is not None and size > max_bytes:
        raise OSError(f"entry of {size} bytes exceeds the cache's bound of {max_bytes}")
    file.write(head)
    file.write(bytes(_padding(len(head))))
    written = 0
    for record, array in zip(writer.table, writer.arrays, strict=True):
        file.write(bytes(record["offset"] - written))
        file.write(memoryview(array).cast("B"))
        written = record["offset"] + array.nbytes
    return size


def _typed(raw: np.ndarray, record: dict[str, Any]) -> np.ndarray:
    """A numpy array's bytes as the array; a tensor's stay bytes (the reader views them as its torch dtype)."""
    if record["kind"] == "tensor":
        return raw
    dtype = np.dtype(record["dtype"])
    if dtype.hasobject or record["kind"] != "array":
        raise CorruptEntry(f"an array of {record['kind']} {record['dtype']!r}")
    return raw.view(dtype).reshape(record["shape"])


def _chunks(buffer: Any, file: Any, start: int, count: int) -> Iterator[Any]:
    """Bytes ``start .. start + count`` of the entry: read from ``file`` where given, so that checking them
    maps none of ``buffer``'s pages into the process (those of weights never used stay out of its memory),
    else ``buffer``'s own."""
    if file is None:
        yield np.frombuffer(buffer, np.uint8, count, start)
        return
    for offset in range(start, start + count, _CHUNK):
        yield os.pread(file.fileno(), min(_CHUNK, start + count - offset), offset)


def read_entry(buffer: Any, file: Any = None) -> Any:
    """The objects of the entry in ``buffer`` (bytes-like, its arrays' views into it), checked against the same
    bytes read from ``file`` where given; :class:`CorruptEntry` where it does not check out."""
    data = memoryview(buffer).cast("B")
    if bytes(data[: len(MAGIC)]) != MAGIC:
        raise CorruptEntry("not a weight cache entry (or another version's)")
    table_length = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 8], "little")
    if table_length > len(data):
        raise CorruptEntry("table longer than the file")
    start = len(MAGIC) + 8
    table = json.loads(bytes(data[start : start + table_length]))
    structure = bytes(data[start + table_length : start + table_length + table["structure"]])
    head = start + table_length + table["structure"]
    first = head + _padding(head)
    if first + table["data"] != len(data):
        raise CorruptEntry(f"{len(data)} bytes where the table says {first + table['data']}")
    checksum = xxhash.xxh3_128(structure)
    arrays, position = [], 0
    for record in table["arrays"]:
        if record["offset"] < position or record["offset"] + record["nbytes"] > table["data"]:
            raise CorruptEntry("array outside the data")
        raw = np.frombuffer(buffer, np.uint8, record["nbytes"], first + record["offset"])
        for chunk in _chunks(buffer, file, first + record["offset"], record["nbytes"]):
            checksum.update(chunk)
        arrays.append(_typed(raw, record))
        position = record["offset"] + record["nbytes"]
    if checksum.hexdigest() != table["checksum"]:
        raise CorruptEntry("checksum mismatch")
    return _Decoder(arrays, table["arrays"]).decode(json.loads(structure))
