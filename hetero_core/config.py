"""Engine configuration: sizes, component selection, plugins, and the server's section.

Everything is a frozen attrs class validated on construction, so an
``EngineConfig`` that exists is a valid one. ``from_file`` reads JSON in
the seed's flat layout (the size keys at the top level) extended with the
sections below; an unknown key anywhere is an error that lists the keys
allowed there. The ``server`` section belongs to the OpenAI server plugin
(``hetero-serve-openai``): the core keeps it as given, and the plugin checks
it, key by key, when it serves (:func:`config_section`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import attrs

from hetero_core.errors import ConfigError
from hetero_core.validators import boolean, non_empty_string, number_in, optional

MAX_COUNT = 2**24  # no size, budget or queue length is sensibly larger (16,777,216)
MAX_BLOCK_SIZE = 1024
MAX_REPLICAS = 1024  # engine replicas of one server


def _count(high: int = MAX_COUNT) -> Any:
    return number_in(1, high, integer=True, error=ConfigError)


_check_name = non_empty_string(error=ConfigError)
_optional_name = optional(_check_name)


@attrs.frozen
class ComponentSpec:
    """Which registered implementation to use for an extension point, with its options.

    In JSON either a bare name (``"executor": "torch"``) or an object whose
    ``name`` picks the implementation and whose other keys are passed to its
    factory as keyword options (``"executor": {"name": "torch", "dtype": "float32"}``).
    """

    name: str = attrs.field(validator=_check_name)
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)

    @classmethod
    def parse(cls, value: Any, *, field: str) -> ComponentSpec:
        if isinstance(value, ComponentSpec):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, Mapping) and isinstance(value.get("name"), str):
            options = {k: v for k, v in value.items() if k != "name"}
            return cls(value["name"], options)
        raise ConfigError(
            f"{field} must be a component name or an object with a 'name' key, got {value!r}", param=field
        )

    def to_json(self) -> Any:
        return {"name": self.name, **self.options} if self.options else self.name


def _component(default: str) -> Any:
    return attrs.field(
        default=ComponentSpec(default),
        converter=attrs.Converter(
            lambda value, _self, field: ComponentSpec.parse(value, field=field.name), takes_self=True, takes_field=True
        ),
    )


def _optional_component() -> Any:
    return attrs.field(
        default=None,
        converter=attrs.Converter(
            lambda value, _self, field: None if value is None else ComponentSpec.parse(value, field=field.name),
            takes_self=True,
            takes_field=True,
        ),
    )


def _names(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(f"expected a list of plugin names, got {value!r}")


@attrs.frozen
class PluginsConfig:
    """Which plugins load.

    ``disable`` blocks plugins by name before they load (added to the
    ``HETERO_DISABLE_PLUGINS`` environment variable); ``load`` names extra
    plugin modules to import and register (``"package.module"``), for plugins
    that are not installed as distributions.
    """

    disable: tuple[str, ...] = attrs.field(default=(), converter=_names)
    load: tuple[str, ...] = attrs.field(default=(), converter=_names)


@attrs.frozen
class EngineConfig:
    """How to build and run an engine. Sizes count tokens, blocks or sequences."""

    block_size: int = attrs.field(default=16, validator=_count(MAX_BLOCK_SIZE))  # token slots per KV block
    max_num_blocks: int = attrs.field(default=1024, validator=_count())  # KV blocks in the pool
    max_batch_size: int = attrs.field(default=32, validator=_count())  # sequences in one step
    max_num_seqs: int = attrs.field(default=256, validator=_count())  # sequences holding KV at once
    max_model_len: int = attrs.field(default=2048, validator=_count())  # prompt + output tokens
    max_total_tokens: int = attrs.field(default=4096, validator=_count())  # tokens in one step
    memory_threshold: float = attrs.field(
        default=0.9, validator=number_in(0.0, 1.0, low_open=True, error=ConfigError)
    )  # no new admissions while block usage is above this
    max_retry_attempts: int = attrs.field(default=2, validator=number_in(0, 100, integer=True, error=ConfigError))
    max_waiting_requests: int = attrs.field(default=4096, validator=_count())  # submit fails beyond this
    kv_cache_memory_mb: float | None = attrs.field(
        default=None, validator=optional(number_in(0, 2**30, low_open=True, error=ConfigError))
    )  # when set, size the pool from this budget instead of max_num_blocks
    enable_chunked_prefill: bool = attrs.field(default=True, validator=boolean(error=ConfigError))
    model: str | None = attrs.field(
        default=None, validator=_optional_name
    )  # a GGUF file or a Hugging Face folder; None = the embedded SmolLM2
    seed: int = attrs.field(default=0, validator=number_in(0, 2**63 - 1, integer=True, error=ConfigError))
    data_parallel_size: int = attrs.field(
        default=1, validator=_count(MAX_REPLICAS)
    )  # engine replicas (serve and --input-file)
    data_parallel_backend: str = attrs.field(
        default="ray", validator=_check_name
    )  # the serving backend that places them
    tokenizer: ComponentSpec = _component("huggingface")
    scheduler: ComponentSpec = _component("fcfs")
    cache_allocator: ComponentSpec = _component("paged")
    executor: ComponentSpec = _component("torch")
    structured_output: ComponentSpec = _component("llguidance")
    speculator: ComponentSpec | None = _optional_component()  # None: no speculative decoding
    plugins: PluginsConfig = attrs.field(
        factory=PluginsConfig, converter=lambda v: config_section(PluginsConfig, v, "plugins")
    )
    server: Mapping[str, Any] = attrs.field(
        factory=dict, converter=lambda v: _json_object(v, "server")
    )  # the server plugin's section

    def validate(self) -> None:
        """Re-run every field's validator (construction already did; this is for the seed's API)."""
        attrs.validate(self)

    def evolve(self, **changes: Any) -> EngineConfig:
        """A copy with ``changes`` applied (validated like any construction)."""
        return _build(EngineConfig, changes, base=self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> EngineConfig:
        """Build from a JSON-like dict; unknown keys are rejected by name."""
        return _build(cls, values)

    @classmethod
    def from_file(cls, path: str | Path) -> EngineConfig:
        """Read a JSON config file (the seed's ``config.json`` layout plus the sections above)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not UTF-8 text: invalid byte at offset {exc.start}") from exc
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid JSON: {exc}") from exc
        if not isinstance(values, dict):
            raise ConfigError(f"config file {path} must hold a JSON object, got {type(values).__name__}")
        return cls.from_mapping(values)

    def to_json(self) -> dict[str, Any]:
        def convert(_inst: Any, _field: Any, value: Any) -> Any:
            return (
                value.to_json()
                if isinstance(value, ComponentSpec)
                else list(value)
                if isinstance(value, tuple)
                else value
            )

        return attrs.asdict(
            self, recurse=True, value_serializer=convert, filter=lambda a, v: not isinstance(v, ComponentSpec)
        ) | {
            field.name: getattr(self, field.name).to_json()
            for field in attrs.fields(EngineConfig)
            if isinstance(getattr(self, field.name), ComponentSpec)
        }


_SECTIONS: dict[str, type] = {"plugins": PluginsConfig}
_OPEN_SECTIONS = ("server",)  # kept as given; ``evolve`` merges keys onto the current ones, nested objects too
_MOVED_KEYS = {"ray_address": "server.backend_options.address (the ray backend's option)"}


def config_section(cls: type, value: Any, key: str) -> Any:
    """The config section ``key`` as the frozen attrs class ``cls``: given as one, or as a mapping of its fields.

    An unknown key is a ``ConfigError`` naming ``key.unknown`` and listing the allowed keys;
    the class's validators name a bad value. A plugin reads its section of the config with it.
    """
    if isinstance(value, cls):
        return value
    return _build(cls, _json_object(value, key), prefix=f"{key}.")


def _json_object(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be an object, got {value!r}", param=key)
    return dict(value)


def _merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` applied, objects within objects merged key by key."""
    merged = dict(base)
    for key, value in changes.items():
        both = isinstance(value, Mapping) and isinstance(merged.get(key), Mapping)
        merged[key] = _merged(merged[key], value) if both else value
    return merged


def _build(cls: type, values: Mapping[str, Any], *, base: Any = None, prefix: str = "") -> Any:
    allowed = attrs.fields_dict(cls)
    unknown = sorted(set(values) - set(allowed))
    moved = [key for key in unknown if cls is EngineConfig and key in _MOVED_KEYS]
    if moved:
        raise ConfigError(f"config key {moved[0]} is now {_MOVED_KEYS[moved[0]]}", param=moved[0])
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; allowed: {', '.join(sorted(allowed))}",
            param=prefix + unknown[0],
        )
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        section = _SECTIONS.get(key) if cls is EngineConfig else None
        if section is not None and isinstance(value, Mapping):
            value = _build(section, value, base=getattr(base, key, None), prefix=f"{key}.")
        elif cls is EngineConfig and key in _OPEN_SECTIONS and base is not None and isinstance(value, Mapping):
            value = _merged(getattr(base, key), value)
        kwargs[key] = value
    try:
        return attrs.evolve(base, **kwargs) if base is not None else cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"invalid config: {exc}") from exc
