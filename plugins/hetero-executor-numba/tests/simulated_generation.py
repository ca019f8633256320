"""Run with NUMBA_ENABLE_CUDASIM=1: greedy tokens of the numba-cuda executor on a tiny model, as JSON."""

from __future__ import annotations

import json
import sys

from hetero_core import EngineConfig, GenerationParams
from hetero_core.engine import InferenceEngine
from hetero_kernels import cuda as kernels

kernels.configure(tile=16)  # the simulator runs each GPU thread as a Python thread: keep blocks small

model, prompts = sys.argv[1], json.loads(sys.argv[2])
engine = InferenceEngine(
    EngineConfig(model=model, tokenizer="simple", executor="numba-cuda", block_size=4, max_num_blocks=64, max_model_len=128, max_total_tokens=6)
)
records = engine.generate(prompts, GenerationParams(temperature=0.0, max_tokens=3, ignore_eos=True))
print(json.dumps([r.generated_tokens for r in records]))
