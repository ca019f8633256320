"""Hook specifications: every way a plugin can extend hetero-infer.

Two phases. *Discovery* hooks run once, when an engine (or ``hetero-infer
plugins``) collects the installed components: each receives a ``register``
callable and calls it as ``register(name, factory, options=Options)``: a unique
name, a factory, and optionally the attrs class of the component's options
(see :mod:`hetero_core.components`: options are validated against it, and
``hetero-infer plugins`` lists them). *Observer* hooks run while an engine
works; they only watch, and return nothing: one that raises is logged with
its plugin's name and the engine goes on.

The marker and the entry-point group are both named ``hetero_infer``.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

hookspec = pluggy.HookspecMarker("hetero_infer")
hookimpl = pluggy.HookimplMarker("hetero_infer")

Register = Callable[..., None]  # register(name, factory, options=None)


# --------------------------------------------------------------------------- setup


@hookspec(historic=True)
def hetero_add_hookspecs(pluginmanager: Any) -> None:
    """Add a plugin's own hook specifications, as pytest's ``pytest_addhooks`` does.

    Called once per plugin manager for each plugin as it registers (historic:
    plugins registered later still hear it), before any discovery hook runs.
    A plugin that offers its own extension point adds its spec module here
    (``pluginmanager.add_hookspecs(my_hookspecs)``); other plugins then
    implement those hooks like the core's. A plugin-added ``register_*`` hook
    is listed by ``hetero-infer plugins`` beside the core's points.

    :param pluginmanager: the :class:`~hetero_core.plugins.PluginManager`.
    :return: nothing.
    """


# --------------------------------------------------------------------------- discovery


@hookspec
def register_tokenizers(register: Register) -> None:
    """Register tokenizer factories.

    Called once per plugin when components are collected.

    :param register: call ``register(name, factory)`` for each tokenizer this
        plugin provides. ``factory(config, **options)`` receives the
        :class:`~hetero_core.config.EngineConfig` and the options of
        ``config.tokenizer``, and returns a
        :class:`~hetero_core.protocols.Tokenizer`. A name already registered
        by any plugin raises ``ConfigError`` naming both plugins.
    :return: nothing.
    """


@hookspec
def register_scheduler_policies(register: Register) -> None:
    """Register scheduler policy factories.

    Called once per plugin when components are collected.

    :param register: call ``register(name, factory)`` for each policy.
        ``factory(**options)`` receives the options of ``config.scheduler`` and
        returns a :class:`~hetero_core.protocols.SchedulerPolicy`.
    :return: nothing.
    """


@hookspec
def register_cache_allocators(register: Register) -> None:
    """Register KV-cache allocator factories.

    Called once per plugin when components are collected.

    :param register: call ``register(name, factory)`` for each allocator.
        ``factory(num_blocks, block_size, **options)`` receives the pool size
        the engine settled on and the options of ``config.cache_allocator``,
        and returns a :class:`~hetero_core.protocols.CacheAllocator`.
    :return: nothing.
    """


@hookspec
def register_executors(register: Register) -> None:
    """Register executor factories.

    Called once per plugin when components are collected.

    :param register: call ``register(name, factory)`` for each executor.
        ``factory(config, **options)`` receives the
        :class:`~hetero_core.config.EngineConfig` (``config.model`` is None
        for the embedded default model: locate files with
        :func:`hetero_core.model_source.resolve_model_path`) and the options
        of ``config.executor``,
        and returns a :class:`~hetero_core.protocols.Executor`.
    :return: nothing.
    """


@hookspec
def register_structured_output_backends(register: Register) -> None:
    """Register structured-output (grammar engine) factories.

    Called once per plugin when components are collected.

    :param register: call ``register(name, factory)`` for each backend.
        ``factory(tokenizer, **options)`` receives the engine's
        :class:`~hetero_core.protocols.Tokenizer` and the options of
        ``config.structured_output``, and returns a
        :class:`~hetero_core.structured_output.StructuredOutputBackend`
        bound to that tokenizer's vocabulary.
    :return: nothing.
    """


@hookspec
def register_speculators(register: Register) -> None:
    """Register speculators: they propose tokens for speculative decoding (see :mod:`hetero_core.speculation`).

    Called once per plugin when components are collected.

    :param register: call ``register(name, factory)`` for each speculator.
        ``factory(config, model_info, components, **options)`` receives the
        :class:`~hetero_core.config.EngineConfig`, the engine's
        :class:`~hetero_core.protocols.ModelInfo` (proposals are ids of its
        vocabulary), the :class:`~hetero_core.components.ComponentRegistry`
        (to build components of its own, such as a draft model's executor)
        and the options of ``config.speculator``, and returns a
        :class:`~hetero_core.speculation.Speculator`.
    :return: nothing.
    """


@hookspec
def register_serving_backends(register: Register) -> None:
    """Register serving backends: what the OpenAI server and its batch command talk to.

    Called once per plugin when a server (or a batch over a serving backend) is built.

    :param register: call ``register(name, factory)`` for each backend.
        ``factory(config, **options)`` receives the
        :class:`~hetero_core.config.EngineConfig` and the options of
        ``server.backend_options``, and returns a
        :class:`~hetero_core.serving.ServingBackend`. The server's config
        (``server.backend``) picks the name; with ``data_parallel_size`` above 1,
        ``data_parallel_backend`` does.
    :return: nothing.
    """


@hookspec
def register_commands(register: Register) -> None:
    """Register commands of the ``hetero-infer`` program (``serve`` comes from ``hetero-serve-openai``).

    Called once per plugin when components are collected, like every discovery
    hook; ``hetero-infer`` looks a command up when it reads a name that is not
    one of its own (``generate``, ``plugins``, ``bench``, ``export-tokenizer``).

    :param register: call ``register(name, run)`` for each command.
        ``hetero-infer NAME ARGS...`` calls ``run(argv)`` with the arguments
        after the name, as a list of strings; the command parses them itself
        (:func:`hetero_core.cli.options.add_engine_arguments` and
        :func:`~hetero_core.cli.options.engine_config` give it the engine
        flags and the config file) and returns the exit status. An exception
        it raises is one line on stderr, as for the core's commands. A name
        registered twice raises ``ConfigError`` naming both plugins.
    :return: nothing.
    """


# --------------------------------------------------------------------------- observers


@hookspec
def on_engine_started(engine: Any) -> None:
    """An engine finished building: its components are resolved and warmed up.

    :param engine: the :class:`~hetero_core.engine.InferenceEngine`; read its
        ``config``, ``model_info`` and ``get_memory_stats()``.
    :return: nothing.
    """


@hookspec
def on_step_finished(engine: Any, stats: Any) -> None:
    """An engine step finished (called only when some plugin implements it).

    Runs on the engine's thread between steps: keep it short.

    :param engine: the :class:`~hetero_core.engine.InferenceEngine`.
    :param stats: a :class:`~hetero_core.metrics.StepStats` for the step.
    :return: nothing.
    """


@hookspec
def on_request_finished(engine: Any, completed: Any) -> None:
    """A request finished, whatever the reason (stop, length, abort or error).

    :param engine: the :class:`~hetero_core.engine.InferenceEngine`.
    :param completed: the :class:`~hetero_core.outputs.CompletedRequest`.
    :return: nothing.
    """
