"""Relay trees: 1, 2 and 3 chained relays vs a direct connection to the publisher.

    publisher process: XPUB bound (the pipeline's PUB role)
        -> direct: the subscriber connects to it, no hop; or
        -> host process: relay 1 <- relay 2 <- relay 3 (`upstream_market_data`)
        -> subscriber process: 1 SUB on the last relay

The publisher, subscriber and relay host are bench/relay_fanout.py's (same
processes, same counting: every message must arrive), so the figures compare
with its tables. Direct and chain runs alternate, `--reps` times each; the
medians are reported as ratios against direct:

- throughput: messages published / time until the subscriber had them all;
- latency: one-way publisher -> subscriber at a paced rate, p50 and p99; the
  per-hop cost is (chain p50 - direct p50) / hops;
- relay CPU per message and hop: CPU time of the host process (every relay's
  proxy thread, libzmq I/O thread and Python loop) / messages / hops. Less
  sensitive to a loaded machine than the wall-clock figures.

All relays of a chain share one host process (each its own ZeroMQ context and
I/O thread): on a 2-core machine every extra hop competes for the same cores
as the Python endpoints, so this is a pessimistic figure for relays on their
own machines.

Run: .venv/bin/python bench/relay_chain.py [--reps 3] [--messages 50000]
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics

from relay_fanout import HOSTS, RelayHost, Run, one_run


class Direct:
    """No relay: the subscriber connects to the publisher itself (the baseline)."""

    def __init__(self, upstream: str) -> None:
        self.endpoint = upstream

    def close(self) -> None:
        pass


class Chain:
    """`hops` relays, each one's XSUB connected to the previous one's market-data XPUB."""

    def __init__(self, upstream: str, hops: int) -> None:
        self.relays = [RelayHost(upstream)]
        for _ in range(hops - 1):
            parent = self.relays[-1].endpoint
            self.relays.append(RelayHost("", upstream_market_data=parent))  # no pipeline
        self.endpoint = self.relays[-1].endpoint

    def close(self) -> None:
        for relay in reversed(self.relays):
            relay.close()


HOSTS["direct"] = Direct
for _hops in (1, 2, 3):
    HOSTS[f"chain-{_hops}"] = functools.partial(Chain, hops=_hops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=64, help="payload bytes")
    parser.add_argument("--latency-rate", type=float, default=2000.0)
    parser.add_argument("--latency-messages", type=int, default=2000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    modes = ("direct", "chain-1", "chain-2", "chain-3")
    runs: dict[str, list[Run]] = {m: [] for m in modes}
    for _ in range(args.reps):
        for mode in modes:
            thr = one_run(mode, 1, args.size, args.messages, 0.0)
            lat = one_run(mode, 1, args.size, args.latency_messages, args.latency_rate)
            runs[mode].append(Run(thr.rate, thr.cpu_us, lat.p50_us, lat.p99_us))

    def med(mode: str, field: str) -> float:
        return float(statistics.median(getattr(r, field) for r in runs[mode]))

    print(f"\n{args.size} B payload, 1 subscriber, medians of {args.reps} runs:\n")
    print(
        "| path | hops | msg/s | ratio to direct | p50 / p99 us | p50 added per hop us "
        "| relay CPU us/msg per hop |"
    )
    print("|---|---|---|---|---|---|---|")
    for hops, mode in enumerate(modes):
        per_hop = (med(mode, "p50_us") - med("direct", "p50_us")) / hops if hops else 0.0
        print(
            f"| {mode} | {hops} | {med(mode, 'rate'):,.0f} "
            f"| {med(mode, 'rate') / med('direct', 'rate'):.2f} "
            f"| {med(mode, 'p50_us'):.0f} / {med(mode, 'p99_us'):.0f} "
            f"| {per_hop:.0f} | {med(mode, 'cpu_us') / hops if hops else 0.0:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
