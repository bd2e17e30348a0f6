"""Remove what image builds on the offline base left behind, but not the layer cache.

`make e2e-images` runs ``python -m infra.image_prune`` after its builds. Each build on the
offline base (label ``mdp.rootfs``, infra/images/debian/rootfs.sh) leaves untagged images:
the one a rebuild replaced, and every builder stage (the classic builder tags only the
final stage). ``docker image prune --filter until=2h`` took both, by creation time; but a
builder stage that a build has just reused from the cache keeps the creation time of its
first build, so every run after a two-hour pause lost its cache: CI rebuilt the exchange
simulator's and the pipeline's ``jars`` stages in the compose e2e fixture's ``up --build``
(~60 s of the first test's set-up), and the Spark and Kafka bases' in the Kafka-cluster
run (docs/development.md, Test durations).

Builder stages now say which stage they are (``LABEL mdp.stage=<image>-<stage>`` in their
Dockerfile); the newest image of each stage is the one the next build reuses and stays.
Everything else untagged and older than ``KEEP`` goes, as before.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass

#: The label of every image built on the offline base.
BASE_LABEL = "mdp.rootfs"
#: The label a builder stage carries: which Dockerfile stage made the image.
STAGE_LABEL = "mdp.stage"
#: Untagged images younger than this stay (a build running beside may still use them).
KEEP = datetime.timedelta(hours=2)
DOCKER_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Untagged:
    """An untagged image built on the offline base."""

    image_id: str
    created: datetime.datetime
    stage: str  # STAGE_LABEL's value; "" for an image a rebuild replaced


def removable(images: Iterable[Untagged], now: datetime.datetime) -> list[str]:
    """The ids to remove: older than `KEEP`, except the newest image of each builder stage
    (the cache of that stage's next build, whatever its age)."""
    listed = list(images)
    newest: dict[str, Untagged] = {}
    for image in listed:
        best = newest.get(image.stage)
        if image.stage and (best is None or image.created > best.created):
            newest[image.stage] = image
    kept = {image.image_id for image in newest.values()}
    return [i.image_id for i in listed if i.image_id not in kept and now - i.created > KEEP]


def docker_time(text: str) -> datetime.datetime:
    """Docker's RFC 3339 time with nanoseconds (``2026-11-30T22:44:35.123456789Z``), to
    microseconds (``datetime.fromisoformat`` of Python 3.11 reads no nanoseconds)."""
    match = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", text.strip())
    if match is None:
        raise ValueError(f"not a Docker timestamp: {text!r}")
    base, fraction, zone = match.groups()
    micro = (fraction or ".0")[1:7].ljust(6, "0")
    return datetime.datetime.fromisoformat(f"{base}.{micro}{'+00:00' if zone == 'Z' else zone}")


def parse_inspect(lines: Iterable[str]) -> list[Untagged]:
    """``docker image inspect --format INSPECT_FORMAT`` output, one image a line."""
    found = []
    for line in lines:
        image_id, _, rest = line.strip().partition(" ")
        created, _, stage = rest.partition(" ")
        if image_id:
            stage = stage.strip()
            found.append(
                Untagged(image_id, docker_time(created), "" if stage == "<no value>" else stage)
            )
    return found


INSPECT_FORMAT = f'{{{{.Id}}}} {{{{.Created}}}} {{{{index .Config.Labels "{STAGE_LABEL}"}}}}'


def _docker(docker: str, *args: str) -> str:
    done = subprocess.run(
        [docker, *args], capture_output=True, text=True, timeout=DOCKER_TIMEOUT_S, check=True
    )
    return done.stdout


def prune(
    docker: str = "docker", now: datetime.datetime | None = None, *, dry_run: bool = False
) -> list[str]:
    """Remove the removable untagged images (`dry_run`: only name them); returns their ids.
    An image a container still uses is left (``docker rmi`` refuses it), as ``docker image
    prune`` leaves it."""
    listed = _docker(
        docker, "images", "--quiet", "--no-trunc", "--filter", "dangling=true",
        "--filter", f"label={BASE_LABEL}",
    ).split()  # fmt: skip
    if not listed:
        return []
    inspected = parse_inspect(
        _docker(docker, "image", "inspect", "--format", INSPECT_FORMAT, *listed).splitlines()
    )
    gone = removable(inspected, now or datetime.datetime.now(datetime.UTC))
    for image_id in [] if dry_run else gone:
        subprocess.run([docker, "rmi", image_id], capture_output=True, timeout=DOCKER_TIMEOUT_S)
    return gone


def main(argv: list[str]) -> int:
    """``python -m infra.image_prune [--dry-run]``."""
    dry_run = "--dry-run" in argv
    gone = prune(dry_run=dry_run)
    done = "to remove" if dry_run else "removed"
    print(f"image prune: {len(gone)} untagged image(s) of old builds {done}")
    if dry_run:
        print("\n".join(gone))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
