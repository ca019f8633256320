"""The ``torch`` executor: a Llama-family model over a paged KV cache, on CPU or CUDA."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any, Callable

import torch

from hetero_core.batch import ExecutionBatch, ExecutionOutput, ScheduledSequence
from hetero_core.errors import ConfigError
from hetero_core.logs import get_logger
from hetero_core.model_source import resolve_model_path
from hetero_core.params import GenerationParams
from hetero_core.protocols import ModelInfo
from hetero_core.step_layout import StepLayout, layout
from hetero_executor_torch.attention import AttentionInputs, DecodeGroup, PrefillSpan, paged_attention
from hetero_executor_torch.graphs import Capture, CheckedReplay, CudaGraphCapture, DecodeGraphs, GraphCaptureError
from hetero_executor_torch.kernel_attention import kernel_attention, kernel_inputs
from hetero_executor_torch.loading import load_weights
from hetero_executor_torch.model import LlamaModel
from hetero_executor_torch.prompt_scoring import score_prompts
from hetero_executor_torch.quantized import WEIGHT_FORMATS
from hetero_executor_torch.sampling import Sampler, sample_each_alone_on_failure

log = get_logger(__name__)

MIN_DECODES_TO_SPLIT = 8  # below this, one attention call costs less than two

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"executor option device={device!r} is not a torch device", param="device") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("executor option device='cuda' but no CUDA device is available", param="device")
    return resolved


def cpu_has_fast_bf16() -> bool:
    """AVX-512 BF16 or AMX: bf16 matmuls beat fp32 there."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" or cpu_has_fast_bf16() else torch.float32
    if dtype not in DTYPES:
        raise ConfigError(f"executor option dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}", param="dtype")
    if dtype == "float16" and device.type == "cpu":
        raise ConfigError("dtype float16 is for CUDA; on the CPU use float32 or bfloat16", param="dtype")
    return DTYPES[dtype]


def resolve_weight_format(weights: str, device: torch.device, dtype: torch.dtype) -> str:
    """``auto`` keeps a GGUF's 4-bit linears packed where the packed kernels pay (the CPU in bf16);
    float32 stays dense, the exact reference."""
    if weights not in WEIGHT_FORMATS:
        raise ConfigError(f"executor option weights must be one of {', '.join(WEIGHT_FORMATS)}; got {weights!r}", param="weights")
    if weights in ("int8", "int4") and device.type != "cpu":
        raise ConfigError(f"executor option weights={weights!r} runs torch's CPU packed kernels; on {device} use 'dense'", param="weights")
    if weights == "auto" and (device.type != "cpu" or dtype != torch.bfloat16):
        return "dense"
    return weights


class TorchExecutor:
    """Runs a Llama-family model with torch.

    :param dtype: ``auto`` (bf16 on CUDA or a CPU with native bf16, else
        float32), ``float32``, ``bfloat16`` or ``float16`` (CUDA).
    :param kv_cache_dtype: ``auto`` (the model's dtype) or one of the dtypes.
    :param device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    :param num_threads: torch CPU threads (default: torch's choice).
    :param attention: ``torch`` (gather blocks, then scaled-dot-product
        attention) or, on the CPU, ``numba`` (decodes run the Numba CPU
        kernel, which reads the paged cache in place; prefill chunks take the
        torch path; the KV cache is then float32).
    :param weights: how linear weights are held: ``dense`` (the compute
        dtype; the default, fastest end to end on the development machine),
        ``auto`` (on the CPU in bf16, a GGUF's Q4_0/Q4_1 linears stay packed
        int4, everything else dense; otherwise dense), ``int8``
        (per-channel) or ``int4`` (groups of 32): weight-only quantization
        on the CPU, for any checkpoint.
    :param decode_graphs: replay decode-only steps from captured graphs
        (see :mod:`hetero_executor_torch.graphs`): ``auto`` (on CUDA only),
        ``true`` or ``false``. On the CPU, ``true`` runs the graph path's
        checked eager stand-in: no faster, but it exercises the same buffers.
    """

    ATTENTION_BACKENDS = ("torch", "numba")

    def __init__(
        self,
        config: Any,
        dtype: str = "auto",
        kv_cache_dtype: str = "auto",
        device: str = "auto",
        num_threads: int | None = None,
        attention: str = "torch",
        decode_graphs: bool | str = "auto",
        weights: str = "dense",
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        if attention not in self.ATTENTION_BACKENDS:
            raise ConfigError(f"executor option attention must be one of {', '.join(self.ATTENTION_BACKENDS)}; got {attention!r}", param="attention")
        if decode_graphs not in (True, False, "auto"):
            raise ConfigError(f"executor option decode_graphs must be true, false or 'auto'; got {decode_graphs!r}", param="decode_graphs")
        self.device = self._device(device)
        self.uses_graphs = self.device.type == "cuda" if decode_graphs == "auto" else decode_graphs
        self.dtype = resolve_dtype(dtype, self.device)
        self.kv_cache_dtype = self.dtype if kv_cache_dtype == "auto" else resolve_dtype(kv_cache_dtype, self.device)
        self.attention_backend = attention
        attend = self._attention_function()
        if attend is not paged_attention and self.device.type == "cpu":
            self.kv_cache_dtype = torch.float32  # the Numba CPU kernels compute in float32/float64
        self.weight_format = resolve_weight_format(weights, self.device, self.dtype)
        path = resolve_model_path(config.model)
        model_config, tensors = load_weights(path, keep_quantized=self.weight_format in ("auto", "int4"))
        with torch.inference_mode():
            self.model = LlamaModel(model_config, tensors, self.dtype, self.device, attend, self.weight_format)
        self.model_config = model_config
        self._info = ModelInfo(model_config.name, model_config.vocab_size, model_config.max_position_embeddings, model_config.eos_token_ids)
        self.sampler = Sampler(model_config.vocab_size, self.device, default_seed=config.seed, eos_token_ids=model_config.eos_token_ids)
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.block_size = 0
        self.engine_config = config
        self.graphs: DecodeGraphs | None = None
        log.info("model loaded", model=model_config.name, path=str(path), dtype=str(self.dtype), device=str(self.device), weights=self.weight_format)

    def _device(self, device: str) -> torch.device:
        return resolve_device(device)

    def _attention_function(self) -> Callable[..., torch.Tensor]:
        if self.attention_backend == "numba":
            if self.device.type != "cpu":
                raise ConfigError(f"attention 'numba' runs the Numba CPU kernels, not on {self.device}; on CUDA use executor 'numba-cuda'", param="attention")
            from hetero_kernels import cpu

            return kernel_attention(cpu, torch_prefill=True)
        return paged_attention

    @property
    def model_info(self) -> ModelInfo:
        return self._info

    def kv_cache_block_bytes(self, block_size: int) -> int:
        config = self.model_config
        element = torch.tensor([], dtype=self.kv_cache_dtype).element_size()
        return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_size * element

    def initialize_cache(self, num_blocks: int, block_size: int) -> None:
        """Per layer, key and value blocks; with decode graphs, one more block for their padding rows."""
        config = self.model_config
        shape = (num_blocks + (1 if self.uses_graphs else 0), block_size, config.num_kv_heads, config.head_size)
        self.kv_caches = [
            (torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device), torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device))
            for _ in range(config.num_layers)
        ]
        self.block_size = block_size
        if self.uses_graphs:
            engine = self.engine_config
            self.graphs = DecodeGraphs(
                self.model,
                self.kv_caches,
                block_size,
                scratch_block=num_blocks,
                max_batch=min(engine.max_batch_size, engine.max_num_seqs),
                max_model_len=min(engine.max_model_len, config.max_position_embeddings),
                capture=self._graph_capture(),
            )

    def _graph_capture(self) -> Capture:
        return CudaGraphCapture(self.device) if self.device.type == "cuda" else CheckedReplay()

    def warm_up(self, max_num_tokens: int, max_num_seqs: int) -> None:
        """Run the largest prefill and decode steps once, through block 0 (still unused).

        The first pass at a given size is slow (memory first touched, kernels
        picked, with decode graphs the largest batch's graph captured); paying
        it here keeps it off the first requests.
        """
        params = GenerationParams(temperature=0.0, max_tokens=1)
        length = max(2, max_num_tokens)
        tokens = [0] * length
        table = [0] * -(-length // self.block_size)
        prefill = ScheduledSequence(0, tokens, 0, table, True, params, tokens, length, None)
        self.execute(ExecutionBatch([prefill], self.block_size))
        decodes = [ScheduledSequence(i, [0], 1, [0], True, params, [0, 0], 1, None) for i in range(max_num_seqs)]
        self.execute(ExecutionBatch(decodes, self.block_size))

    def execute(self, batch: ExecutionBatch) -> ExecutionOutput:
        with torch.inference_mode(), self._on_device():
            self._copy_blocks(batch)
            step = layout(batch)
            ordered = step.sequences
            scores_prompts = any(s.prompt_logprob_positions for s in ordered)
            normed = None if scores_prompts else self._replay_decodes(step)
            prompt_logprobs: dict[int, list] = {}
            errors: dict[int, str] = {}
            if normed is not None:
                logits = self.model.logits(normed)
            else:
                input_ids, positions, attention, kv_caches, logits_indices = self._prepare(step)
                hidden = self.model.hidden_states(input_ids, positions, attention, kv_caches)
                logits = self.model.logits_at(hidden, logits_indices)
                if scores_prompts:
                    logits_at = functools.partial(self.model.logits_at, hidden)
                    prompt_logprobs, errors = score_prompts(logits_at, ordered, self.model_config.vocab_size, self.device)
            sampled = step.sampled
            output = sample_each_alone_on_failure(self.sampler, logits, sampled) if sampled else ExecutionOutput({})
            output.prompt_logprobs = prompt_logprobs
            output.errors.update(errors)  # a prompt that cannot be scored fails its sequence, sampled or not
            return output

    def _on_device(self) -> contextlib.AbstractContextManager:
        """Makes a CUDA device current (kernels that take no device argument, graphs, numba launches go there)."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def _replay_decodes(self, step: StepLayout) -> torch.Tensor | None:
        """The final hidden states of a decode-only step replayed from a graph; None to run it eagerly."""
        if self.graphs is None or not self.graphs.can_run(step):
            return None
        try:
            return self.graphs.run(step)
        except GraphCaptureError as exc:
            log.warning("decode graphs turned off; decode steps run eagerly", reason=str(exc))
            self.graphs = None
            return None

    def close(self) -> None:
        self.kv_caches = []
        self.graphs = None

    # ------------------------------------------------------------------ step inputs

    def _copy_blocks(self, batch: ExecutionBatch) -> None:
        if not batch.block_copies:
            return
        src = torch.tensor([c.src for c in batch.block_copies], device=self.device)
        dst = torch.tensor([c.dst for c in batch.block_copies], device=self.device)
        for k_cache, v_cache in self.kv_caches:
            k_cache[dst] = k_cache[src]
            v_cache[dst] = v_cache[src]

    def _decode_groups(self, step: StepLayout) -> list[DecodeGroup]:
        """Split the length-sorted decodes in two when there are enough: padding each half only to its own
        longest context costs less attention than padding all of them to the longest."""
        n = step.num_decodes
        halves = [(0, n)] if n < MIN_DECODES_TO_SPLIT else [(0, n // 2), (n // 2, n)]
        groups = []
        for start, stop in halves:
            if start == stop:
                continue
            table = torch.from_numpy(step.block_tables(start, stop))
            lengths = torch.from_numpy(step.context_lens[start:stop])
            mask = (torch.arange(table.shape[1] * step.block_size)[None, :] < lengths[:, None])[:, None, None, :]
            groups.append(DecodeGroup(start, stop - start, table.to(self.device), mask.to(self.device)))
        return groups

    def _prefill_spans(self, step: StepLayout) -> list[PrefillSpan]:
        spans = []
        for i in range(step.num_decodes, len(step.sequences)):
            cached = step.sequences[i].start_position
            start, length, context = int(step.query_start[i]), len(step.sequences[i].token_ids), int(step.context_lens[i])
            if cached == 0:
                spans.append(PrefillSpan(start, length, context, None, None))
            else:
                table = torch.from_numpy(step.block_tables(i, i + 1)[0]).to(self.device)
                causal = torch.arange(context)[None, :] <= (cached + torch.arange(length))[:, None]
                spans.append(PrefillSpan(start, length, context, table, causal.to(self.device)))
        return spans

    def _prepare(self, step: StepLayout):
        device = self.device
        attention = AttentionInputs(
            torch.from_numpy(step.slot_mapping).to(device), step.num_decodes, self._decode_groups(step), self._prefill_spans(step)
        )
        if self.model.attention is not paged_attention:
            attention.kernel = kernel_inputs(step, device)
        return (
            torch.from_numpy(step.input_ids).to(device),
            torch.from_numpy(step.positions).to(device),
            attention,
            self.kv_caches,
            torch.from_numpy(step.sample_rows).to(device),
        )
