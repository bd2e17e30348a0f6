"""Settings for every test in the repository, and how parallel workers share them out."""

from typing import Any

import pytest
from hypothesis import settings

# No per-example deadline: on a loaded 2-core CI machine, with tests in parallel
# workers, an example's wall time says nothing about the code (a 200 ms deadline
# failed a 160 ms example that took 435 ms once). Pytest's own timeout still holds.
settings.register_profile("repo", deadline=None)
settings.load_profile("repo")


#: Test files that share one session fixture costlier than their own work (the
#: session's local platform, e2e/conftest.py `platform`): one worker runs them all.
SHARED_SCOPES = {
    "e2e/test_faults.py": "local-platform",
    "e2e/test_service_metrics.py": "local-platform",
}


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` with `SHARED_SCOPES`: a worker takes a whole file at a time (its
    module fixtures start once), or all files sharing a session fixture, in the order the
    workers collected them. (xdist's own `loadgroup` cannot do it under pytest 9: the
    group it appends to a test id is lost.)"""
    if config.getoption("dist") != "loadfile":
        return None
    # xdist would queue the files with the most tests first (its `--loadscope-reorder`,
    # on by default), undoing the longest-first order of `pytest_collection_modifyitems`:
    # CI's one-test files of 2-4 minutes started after every file of several tests.
    config.option.loadscopereorder = False
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class SharedFixtureScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path: str = super()._split_scope(nodeid)
            return SHARED_SCOPES.get(path, path)

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first in parallel workers (docs/development.md): the scheduler hands
    files out in the order the workers collected them, so a long file handed out last
    would run on alone while the other workers idle. A module says how long it takes
    with ``pytest.mark.heavy(seconds=N)`` (measured on the 2-core machine). A run in
    one process keeps its order."""
    if not hasattr(config, "workerinput"):  # only xdist's workers collect what runs
        return

    def seconds(item: pytest.Item) -> float:
        marker = item.get_closest_marker("heavy")
        return float(marker.kwargs.get("seconds", 60)) if marker else 0.0

    items.sort(key=seconds, reverse=True)  # stable: a module's tests stay together, in order
