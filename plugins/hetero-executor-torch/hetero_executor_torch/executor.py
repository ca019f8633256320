"""The ``torch`` executor: a Llama-family model over a paged KV cache, on CPU or CUDA."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Callable

import torch

from hetero_core.batch import ExecutionBatch, ExecutionOutput, ScheduledSequence
from hetero_core.errors import ConfigError
from hetero_core.logs import get_logger
from hetero_core.model_source import resolve_model_path
from hetero_core.params import GenerationParams
from hetero_core.protocols import ModelInfo
from hetero_executor_torch.attention import AttentionInputs, DecodeGroup, PrefillSpan, paged_attention
from hetero_executor_torch.graphs import Capture, CheckedReplay, CudaGraphCapture, DecodeGraphs, GraphCaptureError
from hetero_executor_torch.kernel_attention import kernel_attention, kernel_inputs
from hetero_executor_torch.loading import load_weights
from hetero_executor_torch.model import LlamaModel
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
        self._info = ModelInfo(model_config.name, model_config.vocab_size, model_config.max_position_embeddings)
        self.sampler = Sampler(model_config.vocab_size, self.device, default_seed=config.seed, eos_token_id=model_config.eos_token_id)
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
            ordered = self._ordered(batch)
            hidden = self._replay_decodes(ordered)
            if hidden is not None:
                logits = self.model.logits(hidden)
            else:
                logits = self.model.forward(*self._prepare(ordered))
            sampled = [s for s in ordered if s.do_sample]
            if not sampled:
                return ExecutionOutput({})
            return sample_each_alone_on_failure(self.sampler, logits, sampled)

    def _on_device(self) -> contextlib.AbstractContextManager:
        """Makes a CUDA device current (kernels that take no device argument, graphs, numba launches go there)."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def _replay_decodes(self, ordered: list) -> torch.Tensor | None:
        """The final hidden states of a decode-only step replayed from a graph; None to run it eagerly."""
        if self.graphs is None or not self.graphs.can_run(ordered):
            return None
        try:
            return self.graphs.run(ordered)
        except GraphCaptureError as exc:
            log.warning("decode graphs turned off; decode steps run eagerly", reason=str(exc))
            self.graphs = None
            return None

    def close(self) -> None:
        self.kv_caches = []
        self.graphs = None

    # ------------------------------------------------------------------ step inputs

    @staticmethod
    def _ordered(batch: ExecutionBatch) -> list:
        """Decodes (one token, something cached) first, shortest context first, then prefill chunks:
        the layout of the forward pass."""
        decodes = sorted((s for s in batch.sequences if len(s.token_ids) == 1 and s.start_position > 0), key=lambda s: s.start_position)
        decode_ids = {id(s) for s in decodes}
        return decodes + [s for s in batch.sequences if id(s) not in decode_ids]

    def _copy_blocks(self, batch: ExecutionBatch) -> None:
        if not batch.block_copies:
            return
        src = torch.tensor([c.src for c in batch.block_copies], device=self.device)
        dst = torch.tensor([c.dst for c in batch.block_copies], device=self.device)
        for k_cache, v_cache in self.kv_caches:
            k_cache[dst] = k_cache[src]
            v_cache[dst] = v_cache[src]

    def _decode_groups(self, decodes: list) -> list[DecodeGroup]:
        """Split the length-sorted decodes in two when there are enough: padding each half only to
        its own longest sequence cuts the attention work of short sequences in a large batch."""
        size = self.block_size
        halves = [decodes] if len(decodes) < MIN_DECODES_TO_SPLIT else [decodes[: len(decodes) // 2], decodes[len(decodes) // 2 :]]
        groups, start = [], 0
        for members in halves:
            if not members:
                continue
            lengths = [s.start_position + 1 for s in members]
            blocks = math.ceil(max(lengths) / size)
            tables = [s.block_table[: math.ceil(n / size)] for s, n in zip(members, lengths)]
            table = torch.tensor([t + [0] * (blocks - len(t)) for t in tables], device=self.device)
            mask = (torch.arange(blocks * size)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
            groups.append(DecodeGroup(start, len(members), table, mask.to(self.device)))
            start += len(members)
        return groups

    def _prepare(self, ordered: list):
        size = self.block_size
        num_decodes = sum(1 for s in ordered if len(s.token_ids) == 1 and s.start_position > 0)
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_indices: list[int] = []
        for seq in ordered:
            table = seq.block_table
            for offset, token_id in enumerate(seq.token_ids):
                position = seq.start_position + offset
                ids.append(token_id)
                positions.append(position)
                slots.append(table[position // size] * size + position % size)
            if seq.do_sample:
                logits_indices.append(len(ids) - 1)
        device = self.device
        decode_groups = self._decode_groups(ordered[:num_decodes])
        prefills = []
        start = num_decodes
        for seq in ordered[num_decodes:]:
            length = len(seq.token_ids)
            context = seq.start_position + length
            if seq.start_position == 0:
                prefills.append(PrefillSpan(start, length, context, None, None))
            else:
                table = torch.tensor(seq.block_table[: math.ceil(context / size)], device=device)
                causal = torch.arange(context)[None, :] <= (seq.start_position + torch.arange(length))[:, None]
                prefills.append(PrefillSpan(start, length, context, table, causal.to(device)))
            start += length
        attention = AttentionInputs(torch.tensor(slots, dtype=torch.long, device=device), num_decodes, decode_groups, prefills)
        if self.model.attention is not paged_attention:
            attention.kernel = kernel_inputs(ordered[:num_decodes], ordered[num_decodes:], size, device)
        return (
            torch.tensor(ids, device=device),
            torch.tensor(positions, device=device),
            attention,
            self.kv_caches,
            torch.tensor(logits_indices, dtype=torch.long, device=device),
        )
