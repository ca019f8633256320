"""Which replica serves a request: prefix affinity first, the least-loaded replica when affinity would overload one.

A policy sees the prompt's token ids and the load of the replicas that can
take work now, and returns one of them. ``load`` is a replica's outstanding
tokens: the prompt and ``n * max_tokens`` of every request routed to it and
not finished yet, less the tokens it has produced. Policies are pure Python
(no Ray), so ``benchmarks/routing_sim.py`` replays traces through the same
code the server runs.

Select one with the backend option ``routing`` (a name below, or
``"package.module:factory"`` for your own) and pass it ``routing_options``.
A policy is any object with the :class:`RoutingPolicy` methods.
"""

from __future__ import annotations

import collections
import importlib
import random
from typing import Any, Callable, Iterator, Protocol, Sequence

import attrs

from hetero_core.errors import ConfigError


@attrs.frozen
class ReplicaLoad:
    """A replica that can take a request now, as the router sees it."""

    index: int
    load: int  # outstanding tokens


class RoutingPolicy(Protocol):
    def choose(self, token_ids: Sequence[int], replicas: Sequence[ReplicaLoad]) -> int:
        """The ``index`` of the replica (one of ``replicas``, never empty) to serve a prompt of ``token_ids``."""

    def forget(self, index: int) -> None:
        """Replica ``index`` lost its state (it died or restarted): its prefix cache is empty."""


class LeastLoadedPicker:
    """The replica with the fewest outstanding tokens; equals take turns, so idle replicas share new work."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self, replicas: Sequence[ReplicaLoad]) -> int:
        lowest = min(r.load for r in replicas)
        tied = sorted(r.index for r in replicas if r.load == lowest)
        chosen = next((index for index in tied if index >= self._next), tied[0])
        self._next = chosen + 1
        return chosen


def block_hashes(token_ids: Sequence[int], block_size: int, max_blocks: int) -> Iterator[int]:
    """A chained hash per full block of the prompt's first ``max_blocks`` blocks, as a prefix cache keys them."""
    digest = 0
    for start in range(0, min(len(token_ids) // block_size, max_blocks) * block_size, block_size):
        digest = hash((digest, *token_ids[start : start + block_size]))
        yield digest


class LeastLoaded:
    """Always the replica with the fewest outstanding tokens."""

    def __init__(self) -> None:
        self._least_loaded = LeastLoadedPicker()

    def choose(self, token_ids: Sequence[int], replicas: Sequence[ReplicaLoad]) -> int:
        return self._least_loaded(replicas)

    def forget(self, index: int) -> None:
        pass


class RandomRouting:
    """A uniformly random replica (a baseline for the simulator)."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def choose(self, token_ids: Sequence[int], replicas: Sequence[ReplicaLoad]) -> int:
        return self._rng.choice(replicas).index

    def forget(self, index: int) -> None:
        pass


class PrefixAffinity:
    """The replica that last served the longest shared prefix, unless that would overload it.

    The router remembers, for each of the first ``max_blocks`` full blocks of
    every prompt it routed, which replica got it (at most ``capacity`` blocks,
    least recently used forgotten first). A request whose prompt starts with
    remembered blocks goes to the replica of the deepest one, where the
    engine's prefix cache most likely still holds them. Affinity gives way to
    the least-loaded replica when the preferred one is overloaded: it holds
    more than ``min_load + imbalance_tokens`` outstanding tokens and more than
    ``imbalance_ratio`` times the least-loaded replica's.

    :param block_size: tokens per block; use the engine's ``block_size`` so blocks match its cache.
    """

    def __init__(
        self,
        block_size: int = 16,
        *,
        max_blocks: int = 64,
        capacity: int = 1 << 20,
        imbalance_tokens: int = 2048,
        imbalance_ratio: float = 1.5,
    ) -> None:
        for name, value in (("block_size", block_size), ("max_blocks", max_blocks), ("capacity", capacity)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"routing option {name} must be a positive integer, got {value!r}", param=name)
        if not isinstance(imbalance_tokens, int) or imbalance_tokens < 0:
            raise ConfigError(
                f"routing option imbalance_tokens must be an integer >= 0, got {imbalance_tokens!r}",
                param="imbalance_tokens",
            )
        if not isinstance(imbalance_ratio, (int, float)) or imbalance_ratio < 1:
            raise ConfigError(
                f"routing option imbalance_ratio must be a number >= 1, got {imbalance_ratio!r}",
                param="imbalance_ratio",
            )
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.capacity = capacity
        self.imbalance_tokens = imbalance_tokens
        self.imbalance_ratio = imbalance_ratio
        self._owner: collections.OrderedDict[int, int] = collections.OrderedDict()  # block hash -> replica index
        self._least_loaded = LeastLoadedPicker()

    def choose(self, token_ids: Sequence[int], replicas: Sequence[ReplicaLoad]) -> int:
        hashes = list(block_hashes(token_ids, self.block_size, self.max_blocks))
        chosen = self._preferred(hashes, replicas)
        if chosen is None:
            chosen = self._least_loaded(replicas)
        self._remember(hashes, chosen)
        return chosen

    def _preferred(self, hashes: list[int], replicas: Sequence[ReplicaLoad]) -> int | None:
        loads = {r.index: r.load for r in replicas}
        for digest in reversed(hashes):  # the deepest remembered block decides
            owner = self._owner.get(digest)
            if owner is None or owner not in loads:
                continue
            min_load = min(loads.values())
            overloaded = (
                loads[owner] > min_load + self.imbalance_tokens and loads[owner] > self.imbalance_ratio * min_load
            )
            return None if overloaded else owner
        return None

    def _remember(self, hashes: list[int], index: int) -> None:
        for digest in hashes:
            self._owner[digest] = index
            self._owner.move_to_end(digest)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def forget(self, index: int) -> None:
        for digest in [d for d, owner in self._owner.items() if owner == index]:
            del self._owner[digest]


POLICIES: dict[str, Callable[..., RoutingPolicy]] = {
    "prefix_affinity": PrefixAffinity,
    "least_loaded": lambda block_size=16: LeastLoaded(),
    "random": lambda block_size=16, seed=0: RandomRouting(seed),
}


def make_policy(name: str, block_size: int, options: dict[str, Any]) -> RoutingPolicy:
    """The policy called ``name`` (or at ``"module:factory"``), built with ``block_size`` and ``options``."""
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot load routing policy {name!r}: {exc}", param="routing") from exc
    else:
        factory = POLICIES.get(name)
        if factory is None:
            raise ConfigError(
                f"unknown routing policy {name!r}; built in: {', '.join(POLICIES)} (or 'module:factory')",
                param="routing",
            )
    try:
        return factory(block_size=block_size, **options)
    except TypeError as exc:
        raise ConfigError(
            f"routing policy {name!r} does not accept options {sorted(options)}: {exc}", param="routing_options"
        ) from exc
