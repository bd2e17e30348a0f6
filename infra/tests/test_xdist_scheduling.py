"""The parallel stack phase's scheduler (root conftest.py): whole files, longest first.

Its order decides `make test`'s length: a long file handed out last runs on alone
while the other workers idle (docs/development.md, Test durations).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, cast

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _root_conftest() -> ModuleType:
    """The root conftest as a module of its own (importlib mode: it is not importable)."""
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Node:
    """What the scheduler uses of an xdist worker: it queues test indexes on it."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.queued: list[int] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.queued += indexes

    def shutdown(self) -> None:
        self.shutting_down = True


def _schedule(collection: list[str], workers: int) -> list[list[str]]:
    """The files each worker is given at the start, first given first, with xdist's own
    option defaults (as its plugin registers them: `--loadscope-reorder` is on)."""
    option = SimpleNamespace(dist="loadfile", tx=[f"{workers}*popen"], loadscopereorder=True)
    config = SimpleNamespace(option=option, getoption=lambda name: getattr(option, name))
    config.getvalue = config.getoption
    scheduler: Any = _root_conftest().pytest_xdist_make_scheduler(cast(pytest.Config, config), None)
    nodes = [Node(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
    for node in nodes:
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    return [list(dict.fromkeys(collection[i].split("::")[0] for i in n.queued)) for n in nodes]


def test_files_go_out_in_the_collected_order_not_by_their_number_of_tests() -> None:
    # As a worker collects them: the longest file first (a single test of minutes),
    # then files of several short tests.
    collection = [
        "long.py::test_crash_points",
        "longer_than_short.py::test_a",
        "many.py::test_1",
        "many.py::test_2",
        "many.py::test_3",
        "short.py::test_a",
        "short.py::test_b",
    ]
    first = [files[0] for files in _schedule(collection, workers=2)]
    assert first == ["long.py", "longer_than_short.py"]


def test_files_sharing_the_local_platform_go_to_one_worker() -> None:
    collection = [
        "e2e/test_faults.py::test_a",
        "other.py::test_a",
        "e2e/test_service_metrics.py::test_a",
        "e2e/test_service_metrics.py::test_b",
    ]
    assigned = _schedule(collection, workers=2)
    assert ["e2e/test_faults.py", "e2e/test_service_metrics.py"] in assigned, assigned
