"""CLI: ``python -m infra.localstack up|down|status [--data-dir DIR] [--config FILE]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infra.artifacts import ArtifactError
from infra.localstack.config import StackConfig
from infra.localstack.stack import LocalStack


def _print_status(stack: LocalStack, check: bool = False) -> int:
    rows = stack.status()
    print(f"data dir: {stack.config.data_dir}")
    print(f"{'component':<13} {'state':<15} {'pid':>8} {'RSS MiB':>8}  address / ports")
    total = 0
    for s in rows:
        total += s.rss_bytes
        pid = str(s.pid) if s.pid is not None else "-"
        rss = f"{s.rss_bytes / 2**20:.0f}" if s.rss_bytes else "-"
        ports = ",".join(str(p) for p in s.ports.values())
        print(f"{s.name:<13} {s.state:<15} {pid:>8} {rss:>8}  {s.address}  (ports {ports})")
    print(f"{'total':<13} {'':<15} {'':>8} {total / 2**20:>8.0f}")
    if any(s.state == "running" for s in rows):
        e = stack.endpoints
        print(f"kafka bootstrap: {e.kafka_bootstrap}")
        print(f"s3 endpoint:     {e.s3_endpoint}  (bucket {e.s3_bucket}, region {e.s3_region})")
        print(f"iceberg catalog: {e.catalog_uri}  (warehouse {e.warehouse})")
    if check and not all(s.state == "running" for s in rows):
        return 3
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.localstack",
        description="Run Kafka, SeaweedFS S3 and the Iceberg REST catalog as local processes.",
    )
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--data-dir", type=Path, help="default: $INFRA_STACK_DATA_DIR or .data/")
    parser.add_argument("--config", type=Path, help="YAML config (default: $INFRA_STACK_CONFIG)")
    parser.add_argument(
        "--check", action="store_true", help="status: exit 3 unless every component runs"
    )
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    try:
        config = StackConfig.load(args.config, **overrides)
    except (ValueError, OSError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"[localstack] ERROR: invalid stack config: {exc}", file=sys.stderr)
        return 2
    stack = LocalStack(config)
    try:
        if args.command == "up":
            stack.up()
            return _print_status(stack)
        if args.command == "down":
            stack.down()
            return 0
        return _print_status(stack, check=args.check)
    except (ArtifactError, RuntimeError) as exc:
        print(f"[localstack] ERROR: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
