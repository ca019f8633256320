"""Llama-shaped GGUF files of real sizes in K-quant mixes, for start-up, memory and speed on more than the embedded
model.

    python benchmarks/synthetic_gguf.py OUT_DIR [--sizes 0.5b,3b] [--mixes Q4_K_M,Q6_K]

Every dimension is a multiple of 256, so the K-quants are what the files
hold (a model whose rows are not, such as SmolLM2, gets llama.cpp's fallback
types instead: ``quantize_variants.py`` writes those). The blocks are random
but valid: their float16 factors are small and finite, so activations stay
finite. The tokenizer and chat template are the embedded model's, so the
engine and llama-cpp-python load the files as they load a downloaded one.
The text they generate is meaningless; time and memory are what they measure.

Mixes (llama.cpp's presets, simplified): ``Q4_K_M`` is Q4_K everywhere except
the head and, in the first and last eighth of the layers and every third one
between, the v and down projections, which are Q6_K; ``Q6_K`` is Q6_K
everywhere. Norms are float32.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

from hetero_core.model_source import embedded_model_path

T = gguf.GGMLQuantizationType
SIZES = {  # hidden, intermediate, layers, heads, kv heads
    "0.5b": (1024, 4096, 24, 16, 4),
    "3b": (3072, 8192, 28, 24, 8),
}
F16_FACTORS = {
    T.Q4_K: ((0, 1e-4), (2, 1e-4)),
    T.Q6_K: ((208, 1e-5),),
}  # (byte offset, size) of each block's f16 factors
MIXES = ("Q4_K_M", "Q6_K")


def more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of layers whose v and down projections get the larger type in a _M mix."""
    eighth = layers // 8
    return layer < eighth or layer >= 7 * eighth or (layer - eighth) % 3 == 2


def tensor_type(mix: str, name: str, layer: int, layers: int) -> T:
    if mix == "Q6_K" or name == "output":
        return T.Q6_K
    return T.Q6_K if name in ("attn_v", "ffn_down") and more_bits(layer, layers) else T.Q4_K


def random_blocks(kind: T, rows: int, inputs: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes per block, then each f16 factor set to a small positive value."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, size=(rows * inputs // block, size), dtype=np.uint8)
    for offset, scale in F16_FACTORS[kind]:
        factors = (rng.random(blocks.shape[0], dtype=np.float32) * scale + scale / 2).astype(np.float16)
        blocks[:, offset : offset + 2] = factors.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def tokenizer_fields(writer: gguf.GGUFWriter) -> int:
    """The embedded model's ``tokenizer.*`` metadata copied into ``writer``; returns the vocabulary size."""
    reader = gguf.GGUFReader(embedded_model_path())
    for field in reader.fields.values():
        if field.name.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type)
    return len(reader.fields["tokenizer.ggml.tokens"].contents())


def write(path: Path, size: str, mix: str, seed: int = 0) -> None:
    hidden, intermediate, layers, heads, kv_heads = SIZES[size]
    head_size = hidden // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"synthetic-llama-{size}-{mix}")
    vocab = tokenizer_fields(writer)
    writer.add_block_count(layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_size)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)

    shapes: list[tuple[str, tuple[int, int] | tuple[int], T | None]] = [
        ("token_embd.weight", (vocab, hidden), T.Q4_K if mix != "Q6_K" else T.Q6_K)
    ]
    for i in range(layers):
        projections = {
            "attn_q": (hidden, hidden),
            "attn_k": (kv_heads * head_size, hidden),
            "attn_v": (kv_heads * head_size, hidden),
            "attn_output": (hidden, hidden),
            "ffn_gate": (intermediate, hidden),
            "ffn_up": (intermediate, hidden),
            "ffn_down": (hidden, intermediate),
        }
        shapes += [(f"blk.{i}.attn_norm.weight", (hidden,), None), (f"blk.{i}.ffn_norm.weight", (hidden,), None)]
        shapes += [
            (f"blk.{i}.{name}.weight", shape, tensor_type(mix, name, i, layers)) for name, shape in projections.items()
        ]
    shapes += [
        ("output_norm.weight", (hidden,), None),
        ("output.weight", (vocab, hidden), tensor_type(mix, "output", 0, layers)),
    ]

    for name, shape, kind in shapes:
        if kind is None:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), shape[0] * 4)
        else:
            block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
            row_bytes = shape[1] // block * block_bytes
            writer.add_tensor_info(
                name, (shape[0], row_bytes), np.dtype(np.uint8), shape[0] * row_bytes, raw_dtype=kind
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _name, shape, kind in shapes:
        writer.write_tensor_data(np.ones(shape, np.float32) if kind is None else random_blocks(kind, *shape, rng))
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, from {', '.join(SIZES)}")
    parser.add_argument("--mixes", default=",".join(MIXES), help=f"comma-separated, from {', '.join(MIXES)}")
    args = parser.parse_args()
    sizes, mixes = args.sizes.split(","), args.mixes.split(",")
    unknown = [s for s in sizes if s not in SIZES] + [m for m in mixes if m not in MIXES]
    if unknown:
        parser.error(f"unknown size or mix: {', '.join(unknown)}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for size in sizes:
        for mix in mixes:
            path = args.out_dir / f"synthetic-llama-{size}.{mix}.gguf"
            write(path, size, mix)
            print(f"{path}: {path.stat().st_size / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()
