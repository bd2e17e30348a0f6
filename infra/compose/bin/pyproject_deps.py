"""Print a pyproject's ``[project] dependencies``, one per line, minus the names given.

Used by the Spark image build: the pipeline's dependencies without ``pyspark``
(Spark's own copy in /opt/spark/python is used) and without ``mdproto``
(installed from ./proto). Reading the pyproject keeps the image in step with it.

    python pyproject_deps.py services/spark-pipeline/pyproject.toml pyspark mdproto
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dependencies(pyproject: Path, exclude: Sequence[str] = ()) -> list[str]:
    deps: list[str] = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    skip = {canonical(n) for n in exclude}
    kept = []
    for dep in deps:
        match = _NAME.match(dep.strip())
        if match is None:
            raise ValueError(f"{pyproject}: cannot read the name of dependency {dep!r}")
        if canonical(match.group(0)) not in skip:
            kept.append(dep.strip())
    return kept


def main(argv: Sequence[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print("\n".join(dependencies(Path(argv[0]), argv[1:])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
