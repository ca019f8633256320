"""Routing simulator: a synthetic multi-tenant chat trace over 8 to 256 simulated replicas.

    python benchmarks/routing_sim.py                          # 8, 16, 32, 64, 128, 256 replicas
    python benchmarks/routing_sim.py --replicas 8 64 --requests-per-replica 100

The trace: tenants, each with its own system prompt (200..1,500 tokens),
whose users hold multi-turn chats; every turn's prompt is the system prompt,
the conversation so far and a new message, and its answer joins the next
turn. Arrivals are Poisson, sized so the cluster runs at ``--utilization``.

Each simulated replica has an LRU prefix cache of ``--cache-blocks`` blocks
and serves its queue first-come first-served at ``--tokens-per-second``; a
prompt token found in its cache costs ``--cached-cost`` of a computed one.
Routing goes through the policies the ``ray`` backend runs
(:mod:`hetero_serve_ray.routing`), fed the same load figure: outstanding tokens.

Reports per policy: prefix-cache hit rate (prompt tokens found in the cache
of the replica that served them), load imbalance (the most loaded replica's
outstanding tokens over the mean, averaged over arrivals), mean queueing
delay, and the policy's own time per decision.
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import time

import attrs

from hetero_serve_ray.routing import POLICIES, ReplicaLoad, block_hashes

BLOCK_SIZE = 16
VOCAB = 49152


@attrs.define
class Turn:
    arrival: float
    tokens: list[int]
    output_tokens: int
    chat: int


def make_trace(num_requests: int, num_replicas: int, args: argparse.Namespace) -> list[Turn]:
    """Chats of 1..8 turns from tenants of very unequal popularity; arrival rate fills the cluster to
    ``utilization``."""
    rng = random.Random(args.seed)
    num_tenants = max(4, num_replicas * args.tenants_per_replica)
    systems = [[rng.randrange(17, VOCAB) for _ in range(rng.randint(200, 1500))] for _ in range(num_tenants)]
    popularity = [1 / (rank + 1) for rank in range(num_tenants)]  # Zipf: a few tenants carry most traffic
    chats: dict[int, list[int]] = {}
    open_chats: list[int] = []
    turns: list[Turn] = []
    mean_cost = 900 * args.cached_cost + 300 + 150  # a typical turn: mostly cached context, a new message, an answer
    rate = args.utilization * num_replicas * args.tokens_per_second / mean_cost
    now = 0.0
    while len(turns) < num_requests:
        now += rng.expovariate(rate)
        if open_chats and rng.random() < 0.6:
            chat = rng.choice(open_chats)
        else:
            chat = len(chats)
            chats[chat] = list(systems[rng.choices(range(num_tenants), popularity)[0]])
            open_chats.append(chat)
        history = chats[chat]
        prompt = history + [rng.randrange(17, VOCAB) for _ in range(rng.randint(20, 300))]
        output_tokens = rng.randint(20, 300)
        turns.append(Turn(now, prompt, output_tokens, chat))
        chats[chat] = prompt + [rng.randrange(17, VOCAB) for _ in range(output_tokens)]
        if len(chats[chat]) > 6000 or rng.random() < 1 / 8:
            open_chats.remove(chat)
    return turns


class SimulatedReplica:
    """A FIFO server with an LRU prefix cache of whole blocks."""

    def __init__(self, cache_blocks: int) -> None:
        self.cache: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.cache_blocks = cache_blocks
        self.busy_until = 0.0

    def serve(self, turn: Turn, now: float, args: argparse.Namespace) -> tuple[int, float]:
        """Queue the turn; return the prompt tokens its cache held and the time it waited."""
        hashes = list(block_hashes(turn.tokens, BLOCK_SIZE, len(turn.tokens)))
        hit_blocks = 0
        for digest in hashes:
            if digest not in self.cache:
                break
            hit_blocks += 1
        for digest in hashes:
            self.cache[digest] = None
            self.cache.move_to_end(digest)
        while len(self.cache) > self.cache_blocks:
            self.cache.popitem(last=False)
        hits = hit_blocks * BLOCK_SIZE
        work = (len(turn.tokens) - hits) + hits * args.cached_cost + turn.output_tokens
        start = max(now, self.busy_until)
        self.busy_until = start + work / args.tokens_per_second
        return hits, start - now

    def outstanding_tokens(self, now: float, args: argparse.Namespace) -> int:
        return int(max(0.0, self.busy_until - now) * args.tokens_per_second)


def simulate(policy_name: str, turns: list[Turn], num_replicas: int, args: argparse.Namespace) -> dict[str, float]:
    policy = POLICIES[policy_name](block_size=BLOCK_SIZE)
    replicas = [SimulatedReplica(args.cache_blocks) for _ in range(num_replicas)]
    hits = prompt_tokens = 0
    imbalance, waits, decide = [], [], 0.0
    for turn in turns:
        loads = [ReplicaLoad(index, r.outstanding_tokens(turn.arrival, args)) for index, r in enumerate(replicas)]
        started = time.perf_counter()
        chosen = policy.choose(turn.tokens, loads)
        decide += time.perf_counter() - started
        mean_load = statistics.fmean(load.load for load in loads)
        if mean_load > 0:
            imbalance.append(max(load.load for load in loads) / mean_load)
        hit, wait = replicas[chosen].serve(turn, turn.arrival, args)
        hits += hit
        prompt_tokens += len(turn.tokens)
        waits.append(wait)
    return {
        "hit_rate": hits / prompt_tokens,
        "imbalance": statistics.fmean(imbalance) if imbalance else 1.0,
        "wait_s": statistics.fmean(waits),
        "decision_us": decide / len(turns) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    parser.add_argument("--requests-per-replica", type=int, default=40)
    parser.add_argument("--tenants-per-replica", type=int, default=2)
    parser.add_argument(
        "--cache-blocks", type=int, default=4096, help="prefix-cache blocks per replica (16 tokens each)"
    )
    parser.add_argument(
        "--tokens-per-second", type=float, default=5000.0, help="computed tokens per second per replica"
    )
    parser.add_argument(
        "--cached-cost", type=float, default=0.05, help="cost of a cached prompt token relative to a computed one"
    )
    parser.add_argument("--utilization", type=float, default=0.7)
    parser.add_argument(
        "--policies", nargs="+", default=["prefix_affinity", "least_loaded", "random"], choices=sorted(POLICIES)
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(
        f"block {BLOCK_SIZE} tokens, cache {args.cache_blocks} blocks/replica,"
        f" {args.tokens_per_second:.0f} tokens/s/replica,"
        f" cached token cost {args.cached_cost}, utilization {args.utilization},"
        f" {args.requests_per_replica} requests/replica"
    )
    print(f"{'replicas':>8} {'policy':>16} {'hit rate':>9} {'imbalance':>10} {'mean wait':>10} {'decision':>10}")
    for num_replicas in args.replicas:
        turns = make_trace(num_replicas * args.requests_per_replica, num_replicas, args)
        for name in args.policies:
            result = simulate(name, turns, num_replicas, args)
            print(
                f"{num_replicas:>8} {name:>16} {result['hit_rate']:>9.1%} {result['imbalance']:>9.2f}x"
                f" {result['wait_s'] * 1e3:>8.1f}ms {result['decision_us']:>8.1f}us"
            )


if __name__ == "__main__":
    main()
