"""The GGUF header reader gives what the ``gguf`` package's reader gives, on the embedded file and on files written
here."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from hetero_core.gguf_header import read_gguf_header
from hetero_core.model_source import resolve_model_path


def assert_same_header(path) -> None:
    ours, theirs = read_gguf_header(path), gguf.GGUFReader(path)
    expected = {name: field.contents() for name, field in theirs.fields.items() if not name.startswith("GGUF.")}
    assert ours.fields == expected
    assert [(t.name, t.shape, t.ggml_type, t.offset) for t in ours.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset)) for t in theirs.tensors
    ]
    assert ours.data_offset == theirs.data_offset


@pytest.mark.model
def test_the_embedded_files_header_reads_as_gguf_reads_it() -> None:
    assert_same_header(resolve_model_path(None))


def test_every_value_type_and_alignment_read_back(tmp_path) -> None:
    path = tmp_path / "values.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint8("t.u8", 7)
    writer.add_int16("t.i16", -3)
    writer.add_uint64("t.u64", 2**40)
    writer.add_float64("t.f64", 0.125)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo")
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, 1.5])
    writer.add_array("t.strings", ["a", "", "ü"])
    writer.add_custom_alignment(64)
    writer.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("v", np.ones(5, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_same_header(path)
    header = read_gguf_header(path)
    assert header.get("t.strings") == ["a", "", "ü"] and header.get("t.u64") == 2**40
    assert header.data_offset % 64 == 0


@pytest.mark.parametrize("content", [b"", b"GGUF", b"GGML" + bytes(20), b"GGUF\x03\x00\x00\x00" + bytes(4)])
def test_a_file_that_is_not_gguf_or_is_cut_short_is_a_value_error(tmp_path, content: bytes) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ValueError):
        read_gguf_header(path)
