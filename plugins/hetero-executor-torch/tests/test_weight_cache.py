"""The weight cache: a GGUF file's built weights read back exactly, keyed by content and settings, never trusted."""

from __future__ import annotations

import io
import os
import pickle
import threading
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from hetero_core.errors import ConfigError
from hetero_executor_torch import weight_cache
from hetero_executor_torch.model import ModelWeights
from hetero_executor_torch.quantized import DenseLinear, PackedLinear
from hetero_executor_torch.weight_cache import CorruptEntry, WeightCache, _Decoder, read_entry, write_entry

from .conftest import tiny_engine, write_tiny_gguf, write_tiny_model


@pytest.fixture(scope="module")
def tiny_q4(tmp_path_factory) -> Path:
    folder = write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))
    return write_tiny_gguf(folder, folder / "tiny.gguf", gguf.GGMLQuantizationType.Q4_0)


def cached_engine(model: Path, directory: Path, **executor):
    options = {"name": "torch", "dtype": "bfloat16", "weight_cache": str(directory), **executor}
    return tiny_engine(model, executor=options)


def greedy(engine, prompt: str = "hello world") -> list[int]:
    from hetero_core.params import GenerationParams

    [record] = engine.generate([prompt], GenerationParams(max_tokens=12, temperature=0, ignore_eos=True))
    return record.generated_tokens


def entries(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{weight_cache.SUFFIX}"))


def test_a_second_start_reads_the_weights_back_and_generates_the_same(tiny_q4, tmp_path, monkeypatch) -> None:
    built = greedy(cached_engine(tiny_q4, tmp_path))
    [entry] = entries(tmp_path)

    def no_build(*args, **kwargs):
        raise AssertionError("the weights were built again")

    monkeypatch.setattr("hetero_executor_torch.executor.build_weights", no_build)
    engine = cached_engine(tiny_q4, tmp_path)
    assert greedy(engine) == built
    assert entries(tmp_path) == [entry]
    linears = [linear for layer in engine.executor.model.layers for linear in layer.linears]
    assert linears and all(isinstance(linear, PackedLinear) for linear in linears)  # read back packed, not dense


def test_the_file_and_every_setting_key_an_entry_of_their_own(tiny_q4, tmp_path) -> None:
    cache = WeightCache(tmp_path, 2**30)
    settings = {"weights": "auto", "dtype": "torch.bfloat16"}
    key = cache.key(tiny_q4, settings)
    assert cache.key(tiny_q4, dict(settings)) == key
    assert cache.key(tiny_q4, {**settings, "dtype": "torch.float32"}) != key
    changed = tmp_path / "changed.gguf"
    data = bytearray(tiny_q4.read_bytes())
    data[-1] ^= 1
    changed.write_bytes(bytes(data))
    assert cache.key(changed, settings) != key


def test_a_files_hash_is_remembered_until_the_file_changes(tiny_q4, tmp_path, monkeypatch) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(tiny_q4.read_bytes())
    cache = WeightCache(tmp_path / "cache", 2**30)
    settings = {"weights": "auto"}
    key = cache.key(model, settings)
    reads = []
    monkeypatch.setattr(weight_cache, "file_digest", lambda path: reads.append(path) or "0" * 32)
    assert cache.key(model, settings) == key and reads == []  # remembered: the file is not read again
    stat = model.stat()
    time.sleep(0.05)  # file times can be as coarse as a scheduler tick
    data = bytearray(model.read_bytes())
    data[-1] ^= 1
    model.write_bytes(bytes(data))
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same size and modification time
    assert cache.key(model, settings) != key and reads == [model]  # the change time differs: read again


def test_a_corrupt_remembered_hash_is_computed_again(tiny_q4, tmp_path) -> None:
    cache = WeightCache(tmp_path, 2**30)
    key = cache.key(tiny_q4, {})
    [memo] = tmp_path.glob(f"*{weight_cache.DIGEST_SUFFIX}")
    memo.write_text("not a hash")
    assert cache.key(tiny_q4, {}) == key


def sample_objects() -> dict:
    table = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    shared = np.arange(10, dtype=np.uint16)
    return {
        "table": table,
        "one": shared,
        "again": shared,
        "ints": np.array([[1, -2]], np.int8),
        "empty": torch.zeros(0),
        "name": "x",
    }


def test_an_entry_round_trips_arrays_tensors_and_shared_references() -> None:
    buffer = io.BytesIO()
    size = write_entry(buffer, sample_objects())
    assert size == len(buffer.getvalue())
    back = read_entry(bytearray(buffer.getvalue()))
    assert torch.equal(back["table"], sample_objects()["table"]) and back["table"].dtype == torch.bfloat16
    assert back["one"] is back["again"]  # stored once, shared again
    np.testing.assert_array_equal(back["ints"], [[1, -2]])
    assert back["empty"].shape == (0,) and back["name"] == "x"


def test_dense_layers_are_stored_plain_and_blocked_again_on_load() -> None:
    weight = torch.randn(32, 64).to(torch.bfloat16)
    layer = pickle.loads(pickle.dumps(DenseLinear(weight, None)))
    assert torch.equal(layer.dense(), weight)
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert torch.equal(layer(x), DenseLinear(weight, None)(x))


@pytest.mark.parametrize("damage", ["flip a weight byte", "cut short", "not an entry", "bad table"])
def test_a_corrupt_entry_is_deleted_and_rebuilt(tiny_q4, tmp_path, damage: str) -> None:
    built = greedy(cached_engine(tiny_q4, tmp_path))
    [entry] = entries(tmp_path)
    data = bytearray(entry.read_bytes())
    if damage == "flip a weight byte":
        data[-100] ^= 0xFF
    elif damage == "cut short":
        del data[-64:]
    elif damage == "not an entry":
        data[:4] = b"GGUF"
    else:
        data[24:32] = b"{{{{{{{{"
    entry.write_bytes(bytes(data))
    assert greedy(cached_engine(tiny_q4, tmp_path)) == built
    [rebuilt] = entries(tmp_path)
    read_entry(bytearray(rebuilt.read_bytes()))  # whole again


def test_an_entry_naming_anything_but_weights_is_refused() -> None:
    class Sneaky:
        def __reduce__(self):
            import os

            return (os.system, ("echo never",))

    with pytest.raises(TypeError, match="cannot cache"):
        write_entry(io.BytesIO(), {"payload": Sneaky()})
    decoder = _Decoder([], [])
    for node in (
        {"function": "os:system"},  # not a kernel module
        {"function": "hetero_kernels.host:os"},  # a module's import, not its own function
        {"object": "os:PathLike", "state": None},  # not an allowed module
        {"object": "hetero_executor_torch.quantized:torch", "state": None},  # not a class defined there
        {"object": "hetero_executor_torch.quantized:PackedLinear.__init__", "state": None},
        {"array": 0},  # no such array
        {"dtype": "load"},  # torch.load is no dtype
        ["a bare list"],
    ):
        with pytest.raises(CorruptEntry):
            decoder.decode(node)


def test_the_least_recently_read_entries_go_first_and_an_oversized_one_is_not_kept(tmp_path) -> None:
    objects = {"weights": np.zeros(4096, np.uint8)}
    one = len(_entry_bytes(objects))
    cache = WeightCache(tmp_path, 2 * one)
    for key in ("a", "b"):
        cache.store(key, objects)
    cache.load("a")  # now more recently read than b
    import os

    os.utime(cache.path("b"), (1, 1))
    cache.store("c", objects)
    assert {path.stem for path in entries(tmp_path)} == {"a", "c"}
    WeightCache(tmp_path, one - 1).store("big", objects)
    assert not cache.path("big").exists()
    assert not list(tmp_path.glob("*.tmp"))


def test_an_entry_that_cannot_be_written_leaves_nothing_and_raises_nothing(tmp_path) -> None:
    cache = WeightCache(tmp_path, 2**30)
    cache.store("unstorable", {"weights": np.zeros(4), "how": lambda: None})  # a lambda cannot be pickled
    assert not list(tmp_path.iterdir())
    read_only = WeightCache(tmp_path / "file", 2**30)
    (tmp_path / "file").write_text("not a directory")
    read_only.store("x", {"weights": np.zeros(4)})
    assert (tmp_path / "file").read_text() == "not a directory"


def _entry_bytes(objects) -> bytes:
    buffer = io.BytesIO()
    write_entry(buffer, objects)
    return buffer.getvalue()


def test_two_starts_writing_one_entry_at_once_both_succeed(tmp_path) -> None:
    cache = WeightCache(tmp_path, 2**30)
    objects = {"weights": np.arange(1 << 20, dtype=np.int32)}
    errors: list[BaseException] = []

    def store() -> None:
        try:
            cache.store("same", objects)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=store) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    np.testing.assert_array_equal(cache.load("same")["weights"], objects["weights"])
    assert not list(tmp_path.glob("*.tmp"))


def test_off_and_a_folder_model_build_without_a_cache(tiny_q4, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(weight_cache.CACHE_ENV, str(tmp_path / "from-env"))
    cached_engine(tiny_q4, "off")
    assert not (tmp_path / "from-env").exists() and not list(tmp_path.glob("**/*.weights"))
    cached_engine(tiny_q4, "auto")
    assert len(entries(tmp_path / "from-env")) == 1
    cached_engine(tiny_q4.parent, tmp_path / "folder")  # a Hugging Face folder is memory-mapped already
    assert not (tmp_path / "folder").exists()


def test_a_bad_option_is_named() -> None:
    from hetero_executor_torch.plugin import TorchExecutorOptions

    with pytest.raises(ConfigError, match="weight_cache"):
        TorchExecutorOptions(weight_cache="")
    with pytest.raises(ConfigError, match="weight_cache_max_gib"):
        TorchExecutorOptions(weight_cache_max_gib=0)


def test_model_weights_hold_every_layer(tiny_q4, tmp_path) -> None:
    engine = cached_engine(tiny_q4, tmp_path)
    [entry] = entries(tmp_path)
    stored = read_entry(bytearray(entry.read_bytes()))
    assert isinstance(stored, ModelWeights) and len(stored.layers) == len(engine.executor.model.layers)


def test_a_tied_head_read_back_is_still_the_embedding(tmp_path) -> None:
    folder = write_tiny_model(tmp_path / "tied", tie=True)
    path = write_tiny_gguf(folder, tmp_path / "tied.gguf", gguf.GGMLQuantizationType.Q8_0)
    built = cached_engine(path, tmp_path / "cache")
    read = cached_engine(path, tmp_path / "cache")
    assert len(entries(tmp_path / "cache")) == 1
    model = read.executor.model
    assert model.lm_head is model.embedding  # one table in memory, as built
    assert greedy(read) == greedy(built)


def test_a_read_only_cache_is_read_and_never_fails_a_start(tiny_q4, tmp_path, monkeypatch) -> None:
    built = greedy(cached_engine(tiny_q4, tmp_path))

    def refuse(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(weight_cache.os, "utime", refuse)  # a hit cannot mark the entry as read
    assert greedy(cached_engine(tiny_q4, tmp_path)) == built
    [entry] = entries(tmp_path)
    entry.write_bytes(b"not an entry")
    monkeypatch.setattr(Path, "unlink", refuse)  # nor can a corrupt entry be deleted: the weights are built
    assert greedy(cached_engine(tiny_q4, tmp_path)) == built
