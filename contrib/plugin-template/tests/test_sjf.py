"""The template plugin passes the contract kit, is found through its entry point and runs in an engine."""

from __future__ import annotations

import pytest

from hetero_core import EngineConfig, GenerationParams
from hetero_core.engine import InferenceEngine
from hetero_core.plugins import ComponentRegistry, create_plugin_manager
from hetero_core.testing import SchedulerPolicyContract
from hetero_core.testing.scheduler_policy import make_sequence
from hetero_sjf_scheduler import ShortestPromptFirst


class TestShortestPromptFirstContract(SchedulerPolicyContract):
    @pytest.fixture
    def policy(self):
        return ShortestPromptFirst()


def test_short_prompts_go_first() -> None:
    long, short = make_sequence(0, num_prompt_tokens=300), make_sequence(1, num_prompt_tokens=5)
    assert ShortestPromptFirst().order_waiting([long, short]) == [short, long]


def test_discovered_through_its_entry_point() -> None:
    registration = ComponentRegistry(create_plugin_manager()).get("scheduler", "sjf")
    assert registration.plugin == "sjf"


def test_selected_by_config_and_serving_requests() -> None:
    engine = InferenceEngine(EngineConfig(scheduler={"name": "sjf", "aging": 4}, tokenizer="simple", executor="mock"))
    assert isinstance(engine.policy, ShortestPromptFirst) and engine.policy.aging == 4
    records = engine.generate(["a much longer prompt " * 5, "short"], GenerationParams(max_tokens=4))
    assert [len(r.generated_tokens) for r in records] == [4, 4]
