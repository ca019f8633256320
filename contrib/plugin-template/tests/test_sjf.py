"""The template plugin passes the contract kit, is found through its entry point and runs in an engine."""

from __future__ import annotations

import pytest

from hetero_core import EngineConfig, GenerationParams
from hetero_core.engine import InferenceEngine
from hetero_core.errors import ConfigError
from hetero_core.plugins import ComponentRegistry, create_plugin_manager
from hetero_core.testing import SchedulerPolicyContract
from hetero_core.testing.scheduler_policy import make_view
from hetero_sjf_scheduler import ShortestPromptFirst


class TestShortestPromptFirstContract(SchedulerPolicyContract):
    @pytest.fixture
    def policy(self):
        return ShortestPromptFirst()


def test_short_prompts_go_first() -> None:
    long, short = make_view(0, num_prompt_tokens=300), make_view(1, num_prompt_tokens=5)
    assert ShortestPromptFirst().order([long, short]) == [short, long]


def test_each_later_arrival_moves_a_long_prompt_aging_tokens_forward() -> None:
    policy = ShortestPromptFirst(aging=10)
    long = make_view(0, num_prompt_tokens=100)
    # scores: 100 - 10 * arrivals since it came, against 20 for the newest prompt; ties go to the earlier arrival
    for later_arrivals, long_first in [(1, False), (7, False), (8, True), (9, True)]:
        short = make_view(later_arrivals, num_prompt_tokens=20)
        assert (policy.order([short, long])[0] is long) == long_first, later_arrivals


def test_computed_prompt_tokens_do_not_count() -> None:
    partly_done = make_view(0, num_prompt_tokens=64, num_computed_tokens=48)  # 16 tokens left to prefill
    fresh = make_view(0, num_prompt_tokens=30, index=1)
    assert ShortestPromptFirst().order([fresh, partly_done]) == [partly_done, fresh]


@pytest.mark.parametrize("aging", [0, -3, 1.5, True])
def test_a_bad_aging_option_is_a_config_error(aging) -> None:
    with pytest.raises(ConfigError, match="aging must be a positive integer"):
        ShortestPromptFirst(aging=aging)


def test_options_are_checked_before_the_policy_is_built() -> None:
    registry = ComponentRegistry(create_plugin_manager())
    with pytest.raises(ConfigError, match="scheduler 'sjf' has no option 'agin'; accepted: aging"):
        registry.create("scheduler", "sjf", {"agin": 3})
    with pytest.raises(ConfigError, match="scheduler 'sjf' option aging must be an integer"):
        registry.create("scheduler", "sjf", {"aging": "soon"})


def test_discovered_through_its_entry_point() -> None:
    registration = ComponentRegistry(create_plugin_manager()).get("scheduler", "sjf")
    assert registration.plugin == "sjf"


def test_selected_by_config_and_serving_requests() -> None:
    engine = InferenceEngine(EngineConfig(scheduler={"name": "sjf", "aging": 4}, tokenizer="simple", executor="mock"))
    assert isinstance(engine.policy, ShortestPromptFirst) and engine.policy.aging == 4
    records = engine.generate(["a much longer prompt " * 5, "short"], GenerationParams(max_tokens=4))
    assert [len(r.generated_tokens) for r in records] == [4, 4]
