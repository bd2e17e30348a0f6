"""Settings for every test in the repository."""

import pytest
from hypothesis import settings

# No per-example deadline: on a loaded 2-core CI machine, with tests in parallel
# workers, an example's wall time says nothing about the code (a 200 ms deadline
# failed a 160 ms example that took 435 ms once). Pytest's own timeout still holds.
settings.register_profile("repo", deadline=None)
settings.load_profile("repo")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """How `make test` spreads stack tests over parallel workers (docs/development.md).

    With ``--dist loadgroup`` a worker takes a whole test file at a time (its module
    fixtures start once), or a whole ``xdist_group`` where files share a session
    fixture (the local platform). Longest first: a module says how long it takes with
    ``pytest.mark.heavy(seconds=N)`` (measured on the 2-core machine), so that no long
    file is handed out last to run on alone. A run in one process keeps its order."""
    dist = config.getoption("dist", "no")
    if dist == "no":
        return
    if dist == "loadgroup":
        for item in items:
            if item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))

    def seconds(item: pytest.Item) -> float:
        marker = item.get_closest_marker("heavy")
        return float(marker.kwargs.get("seconds", 60)) if marker else 0.0

    items.sort(key=seconds, reverse=True)  # stable: a module's tests stay together, in order
