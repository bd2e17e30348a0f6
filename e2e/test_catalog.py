"""The compose platform's Iceberg catalog under concurrent commits (the local stack's
twin is infra/tests/test_stack_iceberg.py)."""

from __future__ import annotations

import pytest

from infra.compose_platform import ComposePlatform
from infra.testing import race_commits

pytestmark = [pytest.mark.e2e, pytest.mark.compose]


def test_concurrent_commits_all_land_on_compose(compose: ComposePlatform) -> None:
    """8 writers x 50 commits through the published catalog: no HTTP 500, none lost."""
    race = race_commits(compose.endpoints.pyiceberg_catalog_properties())
    assert race.landed == race.expected
    assert race.stale_refused  # a real conflict is a 409, so "none lost" means something
