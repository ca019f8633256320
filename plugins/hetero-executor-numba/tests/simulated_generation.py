"""Greedy tokens and prompt logprobs of the numba-cuda executor on a tiny model, in float32 (as the torch executor
they are compared with), how many decode graphs it kept and which kernels ran its layers, as JSON: on a GPU,
or on the CUDA simulator with NUMBA_ENABLE_CUDASIM=1.

Arguments: the model folder, the prompts (JSON) and the executor's config (JSON): the ``numba-cuda`` preset, or the
``torch`` executor with ``attention: numba-cuda``.
"""

from __future__ import annotations

import json
import sys

from hetero_core import EngineConfig, GenerationParams
from hetero_core.engine import InferenceEngine
from hetero_kernels import cuda as kernels

kernels.configure(tile=8)  # the simulator runs each GPU thread as a Python thread: keep blocks small

model, prompts, executor = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
engine = InferenceEngine(
    EngineConfig(
        model=model,
        tokenizer="simple",
        executor=executor,
        block_size=4,
        max_num_blocks=64,
        max_model_len=128,
        max_total_tokens=6,
        max_batch_size=2,
    )
)
records = engine.generate(prompts, GenerationParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=1))
graphs = engine.executor.graphs  # None if they were off, or turned off after a capture failed
fused = engine.executor.model.fused  # the layers' small ops as hetero_kernels.cuda_fused kernels
print(
    json.dumps(
        {
            "graphs": graphs.num_graphs if graphs else 0,
            "fused": fused.kernels.__name__ if fused else None,
            "outputs": [[r.generated_tokens, [e.logprob for e in r.prompt_logprobs[1:]]] for r in records],
        }
    )
)
