"""Write the embedded model again in other llama.cpp quantizations, with llama-cpp-python's quantizer.

    python benchmarks/quantize_variants.py OUT_DIR [--types Q4_K_M,Q5_K_M,Q6_K,Q8_0]

The embedded file is already quantized (Q4_1 with a Q8_0 embedding), so this
requantizes (``allow_requantize``): the variants' weights are not better
than the source's, but their formats are what files of those names hold.
SmolLM2's rows (576 and 1,536 inputs) are not multiples of 256, so where a
preset asks for a K-quant llama.cpp falls back per tensor (Q5_0, Q5_1,
IQ4_NL or Q8_0): that is what such files on model hubs hold too.
"""

from __future__ import annotations

import argparse
import ctypes
from pathlib import Path

import llama_cpp

from hetero_core.model_source import resolve_model_path

FILE_TYPES = {
    "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "Q5_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
    "Q6_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
    "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "Q3_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M,
    "Q2_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
}


def quantize(source: Path, target: Path, file_type: str, threads: int) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[file_type]
    params.allow_requantize = True
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params))
    if status != 0:
        raise SystemExit(f"llama_model_quantize failed ({status}) for {file_type}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument(
        "--types", default="Q4_K_M,Q5_K_M,Q6_K,Q8_0", help=f"comma-separated, from {', '.join(FILE_TYPES)}"
    )
    parser.add_argument("--source", type=Path, help="the file to requantize (default: the embedded SmolLM2)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    source = args.source or resolve_model_path(None)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for file_type in args.types.split(","):
        target = args.out_dir / f"{source.stem.split('.')[0]}.{file_type}.gguf"
        quantize(source, target, file_type, args.threads)
        print(f"{target} ({target.stat().st_size / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
