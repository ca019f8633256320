"""The ``draft`` speculator: its contract and cache bookkeeping on the mock executor, in the engine, and on the
embedded model drafting for itself (full precision and 4-bit)."""

from __future__ import annotations

import random

import pytest

from hetero_core.builtin.mock_executor import MockExecutor
from hetero_core.config import EngineConfig
from hetero_core.engine import InferenceEngine
from hetero_core.errors import ConfigError
from hetero_core.hookspecs import hookimpl
from hetero_core.params import GenerationParams
from hetero_core.plugins import ComponentRegistry, create_plugin_manager
from hetero_core.protocols import ModelInfo
from hetero_core.speculation import ProposalRequest
from hetero_core.testing import SpeculatorContract
from hetero_speculators.draft import DraftSpeculator, common_prefix_length

TARGET = ModelInfo("mock", 259, 1 << 20)
CONFIG = EngineConfig(executor="mock", tokenizer="simple", block_size=4)
PLUGINS = ["hetero_core.testing.reference", "hetero_speculators.plugin"]
PROMPTS = ["speculate on this", "a second, longer prompt for the engine", "x"]


class FaultyMock(MockExecutor):
    """The mock, failing the sequences whose id is in ``fail`` (or the whole batch when it holds -1)."""

    fail: frozenset[int] = frozenset()

    def execute(self, batch):
        if -1 in self.fail:
            raise RuntimeError("the draft broke")
        output = super().execute(batch)
        for seq in batch.sequences:
            if seq.seq_id in self.fail:
                del output.sampled_token_ids[seq.seq_id]
                output.errors[seq.seq_id] = "logits are not finite"
        return output


class FaultyPlugin:
    @hookimpl
    def register_executors(self, register) -> None:
        register("faulty", FaultyMock)


def registry() -> ComponentRegistry:
    pm = create_plugin_manager(entry_points=False, load=PLUGINS)
    pm.register(FaultyPlugin(), name="faulty")
    return ComponentRegistry(pm)


def draft(**options) -> DraftSpeculator:
    return DraftSpeculator(CONFIG, TARGET, registry(), **{"executor": "mock", "block_size": 4, **options})


def propose(speculator: DraftSpeculator, tokens: list[int], max_proposals: int = 8, seq_id: int = 0) -> list[int]:
    return speculator.propose([ProposalRequest(seq_id, tokens, 1, max_proposals)])[0]


class TestDraftContract(SpeculatorContract):
    vocab_size = 259

    @pytest.fixture
    def make_speculator(self):
        return lambda: draft(k=5)


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3, 4], [1, 2, 3, 4, 5], 10) == 4
    assert common_prefix_length([1, 2, 3, 4], [1, 2, 3, 4, 5], 2) == 2
    assert common_prefix_length([1, 2, 9, 4, 5], [1, 2, 3, 4, 5], 10) == 2
    assert common_prefix_length([7], [1], 1) == 0
    assert common_prefix_length([], [1, 2], 1) == 0


def test_proposals_are_the_mocks_greedy_continuation_whatever_the_cache_held_before() -> None:
    """After any mix of kept and rejected proposals, a draft proposes what a fresh one proposes for the same
    tokens: its rewound cache is read back right (the mock's next token hashes the tokens it reads)."""
    kept_drafter, fresh = draft(k=4), draft(k=4)
    rng = random.Random(3)
    tokens = [rng.randrange(259) for _ in range(9)]
    for step in range(12):
        proposal = propose(kept_drafter, tokens, max_proposals=4)
        assert proposal == propose(fresh, tokens, max_proposals=4, seq_id=100 + step)
        assert len(proposal) == 4
        fresh.free(100 + step)
        num_kept = rng.randint(0, 4)
        tokens = tokens + proposal[:num_kept] + [rng.randrange(259)]
    assert fresh.num_used_blocks == 0
    kept_drafter.free(0)
    assert kept_drafter.num_used_blocks == 0


def test_a_sequence_the_pool_cannot_hold_proposes_nothing_and_lets_go_of_its_blocks() -> None:
    speculator = draft(k=4, num_blocks=6)  # 24 slots
    short, long = list(range(10)), list(range(30))
    assert len(propose(speculator, short, seq_id=1)) == 4
    held = speculator.num_used_blocks
    assert held == 4  # 10 tokens and 3 proposals fed back: 13 positions
    assert speculator.propose([ProposalRequest(2, long, 1, 4), ProposalRequest(1, short, 1, 2)]) == [
        [],
        propose(draft(k=4), short, max_proposals=2),
    ]
    assert speculator.num_used_blocks == 3  # sequence 2 took nothing; sequence 1 gave back a block
    speculator.free(1)
    assert speculator.num_used_blocks == 0
    assert len(propose(speculator, list(range(21)), seq_id=3)) == 4  # the whole pool, 24 positions
    speculator.close()


def test_a_failing_draft_step_proposes_nothing_and_never_raises() -> None:
    speculator = draft(executor="faulty", k=3)
    tokens = {1: list(range(5)), 2: list(range(20, 31))}
    requests = [ProposalRequest(seq_id, t, 1, 3) for seq_id, t in tokens.items()]
    speculator.executor.fail = {2}
    first, second = speculator.propose(requests)
    assert len(first) == 3 and second == []
    speculator.executor.fail = {-1}
    assert speculator.propose(requests) == [[], []]
    speculator.executor.fail = set()
    assert speculator.propose(requests) == [first, propose(draft(k=3), tokens[2], max_proposals=3)]
    speculator.close()


def test_a_draft_of_another_vocabulary_is_refused_naming_both() -> None:
    with pytest.raises(ConfigError, match="has 300 tokens, the model it drafts for .'mock'. 259") as raised:
        draft(executor_options={"vocab_size": 300})
    assert raised.value.param == "speculator.model"


def test_options_are_checked_by_name() -> None:
    registration = registry().get("speculator", "draft")
    assert registration.validate_options({"k": 3}) == {
        "model": None,
        "executor": "torch",
        "executor_options": {},
        "k": 3,
        "num_blocks": 256,
        "block_size": 16,
    }
    for options, problem in [
        ({"k": 17}, "k must be an integer in .1, 16., got 17"),
        ({"num_blocks": 0}, "num_blocks must be"),
        ({"block_size": 2.5}, "block_size must be"),
        ({"executor": ""}, "executor must be a non-empty string"),
        ({"model": 3}, "model must be a non-empty string"),
        ({"executor_options": [1]}, "executor_options must be an object of named options"),
    ]:
        with pytest.raises(ConfigError, match=problem):
            registration.validate_options(options)
    with pytest.raises(ConfigError, match="unknown executor 'nope'"):
        draft(executor="nope")


def test_the_mock_drafting_for_itself_keeps_every_proposal_and_plain_output() -> None:
    params = GenerationParams(temperature=0.0, max_tokens=24)
    config = EngineConfig.from_mapping(
        dict(
            tokenizer="simple",
            executor="mock",
            scheduler="reference",
            cache_allocator="reference",
            block_size=4,
            max_num_blocks=64,
        )
    )
    plain_engine = InferenceEngine(config, plugin_manager=create_plugin_manager(entry_points=False, load=PLUGINS))
    plain = plain_engine.generate(PROMPTS, params)
    plain_engine.close()
    speculative = config.evolve(speculator={"name": "draft", "executor": "mock", "k": 4, "block_size": 4})
    engine = InferenceEngine(speculative, plugin_manager=create_plugin_manager(entry_points=False, load=PLUGINS))
    records = engine.generate(PROMPTS, params)
    assert [r.generated_tokens for r in records] == [r.generated_tokens for r in plain]
    metrics = engine.metrics
    assert metrics.speculative_accepted_tokens == metrics.speculative_proposed_tokens > 0
    assert metrics.num_steps < 24
    assert engine.get_memory_stats().used_blocks == 0
    assert engine.speculation.is_on and engine.speculation.speculator.num_used_blocks == 0
    engine.close()


CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Count from one to ten."}],
]


def greedy_chats(speculator: dict | None = None):
    """The tokens of greedy replies to CHATS on the embedded model in float32, and the engine's metrics; no block
    is left held, in the engine or in the draft."""
    params = GenerationParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    executor = {"name": "torch", "dtype": "float32"}
    engine = InferenceEngine(EngineConfig(executor=executor, max_model_len=256, speculator=speculator))
    ids = [engine.submit_chat(chat, params) for chat in CHATS]
    records = {r.request_id: r for r in engine.run()}
    assert engine.get_memory_stats().used_blocks == 0
    if speculator is not None:
        assert engine.speculation.is_on and engine.speculation.speculator.num_used_blocks == 0
    engine.close()
    return [records[i].generated_tokens for i in ids], engine.metrics


@pytest.fixture(scope="module")
def plain_tokens() -> list[list[int]]:
    return greedy_chats()[0]


@pytest.mark.model
@pytest.mark.integration  # the torch executor and the Hugging Face tokenizer, through their entry points
def test_the_embedded_model_drafting_for_itself_keeps_every_proposal(plain_tokens) -> None:
    tokens, metrics = greedy_chats({"name": "draft", "executor_options": {"dtype": "float32"}})
    assert tokens == plain_tokens
    assert metrics.speculative_accepted_tokens == metrics.speculative_proposed_tokens > 0


@pytest.mark.model
@pytest.mark.integration
def test_a_4_bit_draft_of_the_embedded_model_keeps_plain_output(plain_tokens) -> None:
    tokens, metrics = greedy_chats({"name": "draft", "executor_options": {"weights": "int4"}})
    assert tokens == plain_tokens
    rate = metrics.speculative_accepted_tokens / metrics.speculative_proposed_tokens
    assert rate > 0.6, f"a 4-bit draft's proposals kept: {rate:.2f}"  # 36 of 37 (0.97) where it was measured
