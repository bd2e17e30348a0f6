"""The prune of old image builds keeps each builder stage's newest image (infra/image_prune.py)."""

from __future__ import annotations

import datetime
from pathlib import Path

from infra import image_prune
from infra.image_prune import Untagged, docker_time, parse_inspect, removable

NOW = datetime.datetime(2026, 11, 30, 23, 0, tzinfo=datetime.UTC)


def ago(hours: float) -> datetime.datetime:
    return NOW - datetime.timedelta(hours=hours)


def test_the_newest_image_of_a_stage_stays_however_old_and_its_older_ones_go() -> None:
    images = [
        Untagged("sha256:relay-now", ago(30), "relay-builder"),  # the cache a build reused
        Untagged("sha256:relay-before", ago(50), "relay-builder"),  # replaced by it
        Untagged("sha256:kafka-jars", ago(3), "offline-kafka-jars"),
    ]
    assert removable(images, NOW) == ["sha256:relay-before"]


def test_a_replaced_final_image_goes_after_two_hours_and_nothing_younger_goes() -> None:
    images = [
        Untagged("sha256:old-final", ago(2.5), ""),
        Untagged("sha256:new-final", ago(1.5), ""),
        Untagged("sha256:relay-before", ago(1), "relay-builder"),
        Untagged("sha256:relay-now", ago(0.5), "relay-builder"),
    ]
    assert removable(images, NOW) == ["sha256:old-final"]


def test_docker_inspect_lines_are_read_with_nanoseconds_and_without_a_label() -> None:
    lines = [
        "sha256:aa 2026-11-30T22:44:35.123456789Z relay-builder",
        "sha256:bb 2026-11-30T20:00:00Z <no value>",
        "",
    ]
    assert parse_inspect(lines) == [
        Untagged("sha256:aa", docker_time("2026-11-30T22:44:35.123456Z"), "relay-builder"),
        Untagged("sha256:bb", datetime.datetime(2026, 11, 30, 20, tzinfo=datetime.UTC), ""),
    ]
    assert docker_time("2026-11-30T22:44:35.5+01:00") == datetime.datetime(
        2026, 11, 30, 21, 44, 35, 500000, tzinfo=datetime.UTC
    )


def test_prune_removes_what_removable_says_through_the_docker_cli(tmp_path: Path) -> None:
    """Against a stub `docker` that answers `images` and `image inspect` and logs `rmi`."""
    log = tmp_path / "rmi.log"
    stub = tmp_path / "docker"
    stub.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  images) echo sha256:now; echo sha256:before ;;\n"
        "  image) echo 'sha256:now 2026-11-29T10:00:00.1Z relay-builder';"
        " echo 'sha256:before 2026-11-28T10:00:00Z relay-builder' ;;\n"
        f'  rmi) echo "$2" >> {log} ;;\n'
        "esac\n"
    )
    stub.chmod(0o755)
    assert image_prune.prune(str(stub), now=NOW) == ["sha256:before"]
    assert log.read_text().split() == ["sha256:before"]
