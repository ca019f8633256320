"""The plugin manager: discovery, blocking, allow-lists, duplicates, unknown names, listing."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import textwrap
import types

import pytest

from hetero_core.errors import ConfigError
from hetero_core.hookspecs import hookimpl, hookspec
from hetero_core.plugins import ComponentRegistry, create_plugin_manager, describe_plugins
from hetero_core.testing.plugin_isolation import installed_plugins


class PolicyPlugin:
    """An inline plugin that registers one scheduler policy."""

    def __init__(self, name: str) -> None:
        self.name = name

    @hookimpl
    def register_scheduler_policies(self, register) -> None:
        register(self.name, lambda **options: ("policy", self.name, options))


def fresh(*plugins: tuple[object, str], **kwargs) -> ComponentRegistry:
    pm = create_plugin_manager(entry_points=False, **kwargs)
    for plugin, name in plugins:
        pm.register(plugin, name=name)
    return ComponentRegistry(pm)


def test_components_are_discovered_through_the_hooks() -> None:
    registry = fresh((PolicyPlugin("mine"), "my-plugin"))
    assert registry.names("scheduler") == ["mine"]
    assert registry.names("tokenizer") == ["simple"] and registry.names("executor") == ["mock"]
    assert registry.get("scheduler", "mine").plugin == "my-plugin"
    assert registry.create("scheduler", "mine", {"x": 1}) == ("policy", "mine", {"x": 1})


def test_duplicate_names_fail_naming_both_plugins() -> None:
    with pytest.raises(
        ConfigError, match="'twin' is registered twice: by plugin '(one|two)' and by plugin '(one|two)'"
    ):
        fresh((PolicyPlugin("twin"), "one"), (PolicyPlugin("twin"), "two"))


def test_unknown_names_list_what_is_installed() -> None:
    registry = fresh((PolicyPlugin("alpha"), "a"), (PolicyPlugin("beta"), "b"))
    with pytest.raises(ConfigError, match="unknown scheduler 'gamma'; installed: 'alpha', 'beta'"):
        registry.get("scheduler", "gamma")


def test_unknown_options_list_the_accepted_ones() -> None:
    with pytest.raises(
        ConfigError, match="executor 'mock' has no option 'bogus'; accepted: vocab_size, eos_token_id,"
    ) as raised:
        fresh().create("executor", "mock", {"bogus": 1}, None)
    assert raised.value.param == "executor.bogus"


@pytest.mark.parametrize(
    ("point", "name", "options", "match"),
    [
        (
            "executor",
            "mock",
            {"vocab_size": "many"},
            "executor 'mock' option vocab_size must be an integer in \\[1, 2147483647\\], got 'many'",
        ),
        ("executor", "mock", {"eos_probability": float("inf")}, "eos_probability must be a number in \\[0.0, 1.0\\]"),
        ("tokenizer", "simple", {"add_bos": 1}, "tokenizer 'simple' option add_bos must be true or false, got 1"),
    ],
)
def test_option_values_are_validated_by_their_class(point, name, options, match) -> None:
    with pytest.raises(ConfigError, match=match):
        fresh().create(point, name, options, None)


def test_options_of_an_undeclared_factory_are_checked_against_its_signature() -> None:
    class Plain:
        @hookimpl
        def register_scheduler_policies(self, register) -> None:
            register("plain", lambda depth=1: ("plain", depth))

    registry = fresh((Plain(), "plain"))
    assert registry.create("scheduler", "plain", {"depth": 3}) == ("plain", 3)
    with pytest.raises(ConfigError, match="scheduler 'plain' has no option 'width'; accepted: depth"):
        registry.create("scheduler", "plain", {"width": 3})


def test_a_factory_that_fails_is_a_config_error_naming_its_plugin() -> None:
    class Failing:
        @hookimpl
        def register_executors(self, register) -> None:
            def broken(config):
                raise ValueError("the file is truncated")

            register("broken", broken)

    with pytest.raises(
        ConfigError, match="executor 'broken' \\(plugin 'failing'\\) failed to start: ValueError: the file is truncated"
    ):
        fresh((Failing(), "failing")).create("executor", "broken", {}, None)


def test_blocking_by_name_and_by_environment(monkeypatch) -> None:
    registry = fresh(disable=["builtin"])
    assert registry.names("executor") == []
    monkeypatch.setenv("HETERO_DISABLE_PLUGINS", "blocked, builtin")
    pm = create_plugin_manager(entry_points=False)
    assert pm.register(PolicyPlugin("x"), name="blocked") is None  # blocked before it loads
    assert ComponentRegistry(pm).names("scheduler") == [] and ComponentRegistry(pm).names("tokenizer") == []


def test_an_unknown_hook_fails_loudly() -> None:
    class Typo:
        @hookimpl
        def register_executor(self, register) -> None:  # missing the s
            pass

    module = types.ModuleType("typo_plugin")
    module.register_executor = Typo.register_executor.__get__(Typo())
    sys.modules["typo_plugin"] = module
    try:
        with pytest.raises(ConfigError, match="typo_plugin.*unknown hook"):
            create_plugin_manager(entry_points=False, load=["typo_plugin"])
    finally:
        del sys.modules["typo_plugin"]


def test_modules_named_in_config_load(tmp_path, monkeypatch) -> None:
    (tmp_path / "extra_policy.py").write_text(
        textwrap.dedent(
            """
            from hetero_core.hookspecs import hookimpl

            @hookimpl
            def register_scheduler_policies(register):
                register("extra", lambda: "extra policy")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = ComponentRegistry(create_plugin_manager(entry_points=False, load=["extra_policy"]))
    assert registry.create("scheduler", "extra", {}) == "extra policy"
    with pytest.raises(ConfigError, match="cannot import plugin module 'nowhere'"):
        create_plugin_manager(entry_points=False, load=["nowhere"])


@pytest.fixture
def installed_distribution(tmp_path, monkeypatch):
    """A real (if tiny) installed distribution with a hetero_infer entry point, on sys.path."""
    (tmp_path / "fake_policy_plugin.py").write_text(
        "from hetero_core.hookspecs import hookimpl\n\n@hookimpl\n"
        "def register_scheduler_policies(register):\n    register('fake', lambda: 'fake')\n"
    )
    info = tmp_path / "fake_policy-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-policy\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text("[hetero_infer]\nfake = fake_policy_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "fake"


@pytest.mark.integration  # the installed plugins, through their entry points
def test_entry_points_and_the_allow_list(installed_distribution, monkeypatch) -> None:
    pm = create_plugin_manager()
    assert "fake" in ComponentRegistry(pm).names("scheduler")
    listing = {p["name"]: p for p in describe_plugins(pm)}
    assert listing["fake"] == {
        "name": "fake",
        "version": "1.2.3",
        "hooks": ["register_scheduler_policies"],
        "components": {"scheduler": {"fake": {}}},
    }
    monkeypatch.setenv("HETERO_PLUGINS", "fake")
    allowed = ComponentRegistry(create_plugin_manager())
    assert "fake" in allowed.names("scheduler") and "sjf" not in allowed.names("scheduler")
    assert "fcfs" not in allowed.names("scheduler") and "mock" in allowed.names("executor")  # the built-ins still load
    monkeypatch.setenv("HETERO_PLUGINS", "fake,schedulers")
    assert {"fake", "fcfs", "priority"} <= set(ComponentRegistry(create_plugin_manager()).names("scheduler"))
    monkeypatch.setenv("HETERO_PLUGINS", "")
    monkeypatch.setenv("HETERO_DISABLE_PLUGINS", "fake")
    assert "fake" not in ComponentRegistry(create_plugin_manager()).names("scheduler")


@pytest.fixture(scope="module")
def installed_listing() -> dict[str, dict]:
    with installed_plugins():
        return {p["name"]: p for p in describe_plugins(create_plugin_manager())}


@pytest.mark.integration  # the installed plugins, through their entry points
@pytest.mark.parametrize(
    ("distribution", "plugin", "components"),
    [
        ("hetero-cache-paged", "paged", {"cache_allocator": ["paged"]}),
        ("hetero-schedulers", "schedulers", {"scheduler": ["fcfs", "lpm", "priority"]}),
        ("hetero-executor-torch", "torch", {"executor": ["torch"], "attention_backend": ["numba", "torch"]}),
        ("hetero-executor-numba", "numba-cuda", {"executor": ["numba-cuda"], "attention_backend": ["numba-cuda"]}),
        ("hetero-tokenizer-hf", "huggingface", {"tokenizer": ["huggingface"]}),
        ("hetero-structured-llguidance", "structured-llguidance", {"structured_output": ["llguidance"]}),
        (
            "hetero-serve-openai",
            "serve-openai",
            {"serving_backend": ["command_bridge", "local_engine"], "command": ["batch", "serve"]},
        ),
        ("hetero-serve-ray", "serve-ray", {"serving_backend": ["ray"]}),
    ],
)
def test_the_project_plugins_are_found_through_entry_points(
    installed_listing, distribution: str, plugin: str, components: dict
) -> None:
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{distribution} is not installed (pip install -e plugins/{distribution})")
    assert installed_listing[plugin]["version"] == version
    assert {point: sorted(names) for point, names in installed_listing[plugin]["components"].items()} == components


# Libraries that only some plugin's components use: loading a plugin to register names must not import them.
COMPONENT_LIBRARIES = ("fastapi", "uvicorn", "llguidance", "ray", "numba")

LOAD_EACH_PLUGIN = """
import importlib.metadata, json, sys
imported = {}
for entry_point in importlib.metadata.entry_points(group="hetero_infer"):
    before = set(sys.modules)
    entry_point.load()
    imported[entry_point.name] = sorted(set(sys.argv[1:]) & (set(sys.modules) - before))
print(json.dumps(imported))
"""


@pytest.mark.integration  # the installed plugins, through their entry points, in a fresh interpreter
def test_loading_the_installed_plugins_imports_no_component_library() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_EACH_PLUGIN, *COMPONENT_LIBRARIES], check=True, capture_output=True, text=True
    )
    imported = json.loads(loaded.stdout)
    assert {"serve-openai", "structured-llguidance", "numba-cuda"} <= set(imported)
    assert {plugin: libraries for plugin, libraries in imported.items() if libraries} == {}


def write_distribution(root, name: str, module: str, source: str) -> None:
    """An installed distribution with one hetero_infer entry point ``name`` -> ``module``, on sys.path."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[hetero_infer]\n{name} = {module}\n")


@pytest.fixture
def broken_distribution(tmp_path, monkeypatch) -> str:
    write_distribution(tmp_path, "wreck", "wreck_plugin", "import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "wreck"


@pytest.mark.integration  # the installed plugins, through their entry points
def test_a_plugin_that_fails_to_import_is_listed_as_broken_and_the_others_work(broken_distribution) -> None:
    pm = create_plugin_manager()
    assert "ModuleNotFoundError" in pm.broken["wreck"] and "no_such_module_anywhere" in pm.broken["wreck"]
    listing = {p["name"]: p for p in describe_plugins(pm)}
    assert "ModuleNotFoundError" in listing["wreck"]["broken"] and listing["paged"]["components"]
    registry = ComponentRegistry(pm)
    assert "fcfs" in registry.names("scheduler")
    with pytest.raises(ConfigError, match="unknown executor 'wrecked'.*broken plugins, which may provide it: 'wreck'"):
        registry.get("executor", "wrecked")


def test_a_plugin_whose_register_hook_raises_is_broken_alone() -> None:
    class Raising:
        @hookimpl
        def register_scheduler_policies(self, register) -> None:
            register("half", lambda: None)
            raise RuntimeError("registration bug")

    pm = create_plugin_manager(entry_points=False)
    pm.register(Raising(), name="raising")
    pm.register(PolicyPlugin("fine"), name="fine")
    registry = ComponentRegistry(pm)
    assert registry.names("scheduler") == ["fine"]
    assert pm.broken == {"raising": "its register_scheduler_policies hook raised RuntimeError: registration bug"}


def test_a_plugin_adds_an_extension_point_that_is_listed_and_guarded_like_the_cores() -> None:
    widget_specs = types.SimpleNamespace(register_widgets=hookspec(lambda register: None))

    class Offering:
        @hookimpl
        def hetero_add_hookspecs(self, pluginmanager) -> None:
            pluginmanager.add_hookspecs(widget_specs)

    class Widgets:
        @hookimpl
        def register_widgets(self, register) -> None:
            register("gear")

    class Raising:
        @hookimpl
        def register_widgets(self, register) -> None:
            raise RuntimeError("widget bug")

    pm = create_plugin_manager(entry_points=False)
    pm.register(Widgets(), name="widgets")  # before the spec exists: the historic hook adds it later
    pm.register(Raising(), name="raising")
    pm.register(Offering(), name="offering")
    pm.check_pending()
    listing = {p["name"]: p for p in describe_plugins(pm)}
    assert listing["widgets"]["components"] == {"widget": {"gear": {}}}
    assert listing["raising"] == {
        "name": "raising",
        "broken": "its register_widgets hook raised RuntimeError: widget bug",
    }
    assert "widget" not in listing["offering"]["components"]


def test_loading_a_module_that_is_also_an_entry_point_loads_it_once(installed_distribution) -> None:
    pm = create_plugin_manager(load=["fake_policy_plugin"])
    assert ComponentRegistry(pm).names("scheduler").count("fake") == 1


@pytest.mark.integration  # the installed plugins, through their entry points
@pytest.mark.parametrize("variable", ["HETERO_PLUGINS", "HETERO_DISABLE_PLUGINS"])
def test_typos_in_the_plugin_lists_are_errors(monkeypatch, variable: str) -> None:
    monkeypatch.setenv(variable, "shedulers")
    with pytest.raises(
        ConfigError, match=f"{variable}.* names no installed plugin: 'shedulers'; installed: .*schedulers"
    ):
        create_plugin_manager()


@pytest.mark.integration  # the installed plugins, through their entry points
def test_choosing_a_component_of_a_disabled_plugin_says_so() -> None:
    registry = ComponentRegistry(create_plugin_manager(disable=["paged", "builtin"]))
    with pytest.raises(ConfigError, match="cache_allocator 'paged' is provided by plugin 'paged', which is disabled"):
        registry.get("cache_allocator", "paged")
    with pytest.raises(ConfigError, match="executor 'mock' is provided by plugin 'builtin', which is disabled"):
        registry.get("executor", "mock")
