"""The ``torch`` executor: a Llama-family model over a paged KV cache, on CPU or CUDA."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any

import torch

from hetero_core.batch import ExecutionBatch, ExecutionOutput, ScheduledSequence
from hetero_core.errors import ConfigError
from hetero_core.logs import get_logger
from hetero_core.model_source import resolve_model_path
from hetero_core.params import GenerationParams
from hetero_core.protocols import ModelInfo
from hetero_core.step_layout import StepLayout, layout
from hetero_executor_torch import attention_backend, fused_layers
from hetero_executor_torch.attention_backend import AttentionBackend
from hetero_executor_torch.graphs import Capture, CheckedReplay, CudaGraphCapture, DecodeGraphs, GraphCaptureError
from hetero_executor_torch.loading import load_weights
from hetero_executor_torch.model import LlamaModel, build_weights
from hetero_executor_torch.prompt_scoring import score_prompts
from hetero_executor_torch.quantized import PACKED_MAX_ROWS, WEIGHT_FORMATS, cpu_flags
from hetero_executor_torch.sampling import Sampler, sample_and_verify
from hetero_executor_torch.weight_cache import load_or_build, open_cache

log = get_logger(__name__)

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


def cpu_kernel_variants() -> dict[str, bool]:
    """Which of ``hetero_kernels``' instruction-specific CPU kernels run here (none where the kernels are
    not installed, or with ``HETERO_KERNELS_PORTABLE=1``)."""
    try:
        from hetero_kernels import cpu_variants
    except ImportError:
        return {}
    return cpu_variants()


def cpu_has_fast_bf16() -> bool:
    """AVX-512 BF16 or AMX: bf16 matmuls beat fp32 there."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def resolve_dtype(dtype: str, device: torch.device, gguf: bool = False) -> torch.dtype:
    """``auto``: on CUDA, float16 for a GGUF (its blocks dequantize from float16 scales; on the embedded
    model float16 keeps top-1 agreement with float32 at 100% where bf16 keeps 98.3%) and bf16 for a
    checkpoint folder; on the CPU bf16 where it is native, else float32."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.float16 if gguf else torch.bfloat16
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    if dtype not in DTYPES:
        raise ConfigError(
            f"executor option dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}", param="dtype"
        )
    if dtype == "float16" and device.type == "cpu":
        raise ConfigError("dtype float16 is for CUDA; on the CPU use float32 or bfloat16", param="dtype")
    return DTYPES[dtype]


def resolve_weight_format(weights: str, device: torch.device, dtype: torch.dtype, dtype_option: str = "auto") -> str:
    """``auto`` keeps a GGUF's quantized linears packed on the CPU: in bf16, and in the float32 that
    ``dtype: auto`` picks on a CPU without fast bf16 (dense float32 would hold eight times a 4-bit
    file). A ``dtype: float32`` asked for stays dense, the exact reference; CUDA runs dense."""
    if weights not in WEIGHT_FORMATS:
        raise ConfigError(
            f"executor option weights must be one of {', '.join(WEIGHT_FORMATS)}; got {weights!r}", param="weights"
        )
    if weights in ("int8", "int4") and device.type != "cpu":
        raise ConfigError(
            f"executor option weights={weights!r} runs torch's CPU packed kernels; on {device} use 'dense'",
            param="weights",
        )
    if weights == "auto" and (device.type != "cpu" or dtype == torch.float32 and dtype_option != "auto"):
        return "dense"
    return weights


class TorchExecutor:
    """Runs a Llama-family model with torch.

    :param dtype: ``auto`` (on CUDA float16 for a GGUF file and bf16 for a
        checkpoint folder; on the CPU bf16 where it is native, else
        float32), ``float32``, ``bfloat16`` or ``float16`` (CUDA).
    :param kv_cache_dtype: ``auto`` (the model's dtype) or one of the dtypes.
    :param device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    :param num_threads: torch CPU threads (default: torch's choice).
    :param attention: the attention backend (see
        :mod:`hetero_executor_torch.attention_backend`): ``auto`` (the
        default: ``numba`` on the CPU, else ``torch``), ``torch`` (gather blocks, then scaled-dot-product
        attention), on the CPU ``numba`` (decodes run the Numba CPU kernel,
        which reads the paged cache in place, float32 or bf16; prefill chunks
        take the torch path; in float32 or bf16 with the cache in the same
        dtype, every layer's norms, RoPE and cache writes, and a decode-only
        step's attention, run as fused Numba kernels), a name a plugin
        registers through ``register_attention_backends``, or an
        :class:`AttentionBackend` object.
    :param weights: how linear weights are held: ``auto`` (the default: on
        the CPU in bf16, a GGUF's weights of every type with an exact group
        form (:mod:`hetero_executor_torch.gguf_blocks`) stay packed, exactly as
        the file holds them; everything else dense; otherwise dense), ``dense`` (the compute dtype),
        ``int8`` (per-channel) or ``int4`` (groups of 32): weight-only
        quantization on the CPU, for any checkpoint.
    :param dense_copy: also hold packed weights dense, in the model's dtype,
        for steps of more rows than the packed kernels take (2 bytes a weight
        in bf16 on top of the packed ones). Off by default: those steps widen
        the packed weights a tile at a time instead.
    :param weight_cache: where a GGUF file's weights, as built for this CPU,
        are kept between starts (:mod:`hetero_executor_torch.weight_cache`):
        ``auto`` (``$HETERO_WEIGHT_CACHE``, else the user cache directory's
        ``hetero-infer/weights``), ``off``, or a directory. CPU only.
    :param weight_cache_max_gib: the most the cache directory holds; the least
        recently read entries go first.
    :param decode_graphs: replay decode-only steps from captured graphs
        (see :mod:`hetero_executor_torch.graphs`): ``auto`` (on CUDA only),
        ``true`` or ``false``. On the CPU, ``true`` runs the graph path's
        checked eager stand-in: no faster, but it exercises the same buffers.
    """

    verifies_proposals = True  # samples a speculator's proposals with the sequence's next token

    def __init__(
        self,
        config: Any,
        dtype: str = "auto",
        kv_cache_dtype: str = "auto",
        device: str = "auto",
        num_threads: int | None = None,
        attention: str | AttentionBackend = "auto",
        decode_graphs: bool | str = "auto",
        weights: str = "auto",
        dense_copy: bool = False,
        weight_cache: str = "auto",
        weight_cache_max_gib: float = 16.0,
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        if decode_graphs not in (True, False, "auto"):
            raise ConfigError(
                f"executor option decode_graphs must be true, false or 'auto'; got {decode_graphs!r}",
                param="decode_graphs",
            )
        self.device = resolve_device(device)
        self.attention = attention_backend.resolve(attention, self.device)
        self.uses_graphs = self._uses_graphs(decode_graphs)
        gguf = config.model is None or Path(config.model).suffix == ".gguf"  # no model: the embedded GGUF
        self.dtype = resolve_dtype(dtype, self.device, gguf)
        self.kv_cache_dtype = self.dtype if kv_cache_dtype == "auto" else resolve_dtype(kv_cache_dtype, self.device)
        self.kv_cache_dtype = self.attention.configure(self.device, self.kv_cache_dtype)
        self.weight_format = resolve_weight_format(weights, self.device, self.dtype, dtype)
        path = resolve_model_path(config.model)
        model_config, weights = load_weights(path, keep_quantized=self.weight_format in ("auto", "int4"))
        cache = (
            open_cache(weight_cache, weight_cache_max_gib)
            if self.device.type == "cpu" and path.suffix == ".gguf"
            else None
        )
        settings = dict(
            weights=self.weight_format,
            dtype=str(self.dtype),
            dense_copy=dense_copy,
            cpu_kernels=cpu_kernel_variants(),
        )
        with torch.inference_mode():
            build = functools.partial(
                build_weights,
                model_config,
                weights,
                self.dtype,
                self.device,
                self.weight_format,
                dense_copy,
            )
            built = load_or_build(cache, path, settings, build)
            self.model = LlamaModel(
                model_config, built, self.dtype, self.device, self.attention.attend, self.weight_format
            )
            kernels = fused_layers.fused_kernels(
                self.attention, self.device, self.dtype, self.kv_cache_dtype, model_config
            )
            if kernels is not None:
                self.model.fused = fused_layers.FusedLayers(self.model, kernels)
        self.model_config = model_config
        self._info = ModelInfo(
            model_config.name, model_config.vocab_size, model_config.max_position_embeddings, model_config.eos_token_ids
        )
        self.sampler = Sampler(
            model_config.vocab_size, self.device, default_seed=config.seed, eos_token_ids=model_config.eos_token_ids
        )
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.block_size = 0
        self.engine_config = config
        self.graphs: DecodeGraphs | None = None
        log.info(
            "model loaded",
            model=model_config.name,
            path=str(path),
            dtype=str(self.dtype),
            device=str(self.device),
            weights=self.weight_format,
            dense_copy=dense_copy,
            attention=self.attention.name,
            cpu_kernels=[name for name, runs in cpu_kernel_variants().items() if runs]
            if self.device.type == "cpu"
            else None,
        )

    def _uses_graphs(self, decode_graphs: bool | str) -> bool:
        if self.attention.supports_graphs:
            return self.device.type == "cuda" if decode_graphs == "auto" else bool(decode_graphs)
        if decode_graphs is True:
            raise ConfigError(
                f"attention backend {self.attention.name!r} does not support decode graphs; "
                "set decode_graphs to false or auto",
                param="decode_graphs",
            )
        return False

    @property
    def model_info(self) -> ModelInfo:
        return self._info

    @property
    def max_verify_tokens(self) -> int:
        """Tokens a decoding step with proposals carries at most: where its layers can each run as one call
        (:class:`~hetero_executor_torch.fused_layers.FusedLayers`), as many as that takes (a step of more
        costs about a third more, its layers' kernels called one by one from Python); elsewhere as many as
        every packed layer multiplies without widening its weights (a widening costs several decode steps),
        as it does a plain decoding step of as many sequences. At most
        :data:`~hetero_executor_torch.quantized.PACKED_MAX_ROWS`, so that a step of that many sequences
        carries no proposals."""
        fused = self.model.fused
        one_call_rows = fused.packed_rows if isinstance(fused, fused_layers.FusedLayers) else 0
        return min(PACKED_MAX_ROWS, one_call_rows or self.model.unwidened_rows())

    def kv_cache_block_bytes(self, block_size: int) -> int:
        config = self.model_config
        element = torch.tensor([], dtype=self.kv_cache_dtype).element_size()
        return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_size * element

    def initialize_cache(self, num_blocks: int, block_size: int) -> None:
        """Per layer, key and value blocks; with decode graphs, one more block for their padding rows."""
        config = self.model_config
        shape = (num_blocks + (1 if self.uses_graphs else 0), block_size, config.num_kv_heads, config.head_size)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device),
                torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device),
            )
            for _ in range(config.num_layers)
        ]
        self.block_size = block_size
        if self.uses_graphs:
            engine = self.engine_config
            self.graphs = DecodeGraphs(
                self.model,
                self.attention,
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
        """Run a prefill step and decode steps once, through block 0 (still unused): on CUDA the largest
        prefill, the largest decode and one of three sequences; on the CPU a prefill and decodes of one and
        three sequences, each within the rows every packed layer multiplies without widening
        (:meth:`LlamaModel.unwidened_rows`).

        The first pass at a given size is slow (memory first touched, kernels
        picked or compiled, with decode graphs the largest batch's graph
        captured); paying it here keeps it off the first requests, and on
        CUDA the largest prefill shows at start whether its activations fit
        beside the cache. On the CPU each step of a kind runs the same
        kernels whatever its size, and the cost of a longer one is the
        widening of packed weights for steps over the packed kernels' rows:
        the whole model's at every such step (a 256-token prefill and a
        32-sequence decode added half a second to a 0.5B model's start, more
        to a 3B one's). So the steps
        stay within the rows every layer multiplies without widening: the
        packed kernels', and one row more where the AMX kernel takes the steps
        above them (its first call compiles it: seconds with a cold Numba
        cache, which the first prompt would pay otherwise). The first longer
        step pays the widening kernels' first call (tens of milliseconds)
        instead; the decodes of one and of three sequences run the one-call
        layers where every layer takes them.
        """
        params = GenerationParams(temperature=0.0, max_tokens=1)
        cuda = self.device.type == "cuda"
        rows = max(2, min(self.model.unwidened_rows(), self.model.packed_rows() + 1))
        length = max(2, max_num_tokens if cuda else min(max_num_tokens, rows))
        tokens = [0] * length
        table = [0] * -(-length // self.block_size)
        prefill = ScheduledSequence(0, tokens, 0, table, True, params, tokens, length, None)
        self.execute(ExecutionBatch([prefill], self.block_size))
        decodes = [ScheduledSequence(i, [0], 1, [0], True, params, [0, 0], 1, None) for i in range(max_num_seqs)]
        for count in sorted(
            {max_num_seqs, min(3, max_num_seqs)} if cuda else {1, min(3, rows, max_num_seqs)}, reverse=True
        ):
            self.execute(ExecutionBatch(decodes[:count], self.block_size))

    def execute(self, batch: ExecutionBatch) -> ExecutionOutput:
        with torch.inference_mode(), self._on_device():
            step = layout(batch)
            ordered = step.sequences
            scores_prompts = any(s.prompt_logprob_positions for s in ordered)
            normed = None if scores_prompts else self._replay_decodes(step)
            prompt_logprobs: dict[int, list] = {}
            errors: dict[int, str] = {}
            if normed is not None:
                logits = self.model.logits(normed)
            else:
                input_ids, positions, attention, kv_caches, logits_indices = self.model_inputs(step)
                hidden = self.model.hidden_states(input_ids, positions, attention, kv_caches)
                logits = self.model.logits_at(hidden, logits_indices)
                if scores_prompts:
                    logits_at = functools.partial(self.model.logits_at, hidden)
                    prompt_logprobs, errors = score_prompts(
                        logits_at, ordered, self.model_config.vocab_size, self.device
                    )
            sampled = step.sampled
            output = sample_and_verify(self.sampler, logits, sampled) if sampled else ExecutionOutput({})
            output.prompt_logprobs = prompt_logprobs
            output.errors.update(errors)  # a prompt that cannot be scored fails its sequence, sampled or not
            return output

    def prefill_logits(self, token_ids: list[int], block_table: list[int]) -> torch.Tensor:
        """float32 logits ``[len(token_ids), vocab]`` at every position of ``token_ids``, prefilled in one
        step into the cache blocks ``block_table`` with nothing cached before (for scoring and tests)."""
        params = GenerationParams(temperature=0.0, max_tokens=1)
        sequence = ScheduledSequence(0, token_ids, 0, block_table, True, params, token_ids, len(token_ids), None)
        with torch.inference_mode(), self._on_device():
            input_ids, positions, attention, kv_caches, _ = self.model_inputs(
                layout(ExecutionBatch([sequence], self.block_size))
            )
            return self.model.forward(
                input_ids, positions, attention, kv_caches, torch.arange(len(token_ids), device=self.device)
            )

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

    def model_inputs(self, step: StepLayout) -> tuple:
        """The model's forward arguments for ``step``: token ids, positions, the attention backend's
        inputs, the KV caches and the rows whose logits are sampled."""
        device = self.device
        attention = self.attention.inputs(step, torch.from_numpy(step.slot_mapping).to(device))
        return (
            torch.from_numpy(step.input_ids).to(device),
            torch.from_numpy(step.positions).to(device),
            attention,
            self.kv_caches,
            torch.from_numpy(step.sample_rows).to(device),
        )
