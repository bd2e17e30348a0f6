"""Optional extras: charts and DataFrames fail with the install line when missing."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from mdclient import extras
from mdclient.chart import candlestick_png
from mdclient.extras import MissingExtraError
from mdclient.frames import empty_candles
from mdclient.history import HistoryResult

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _uninstall(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """As if `module` were not installed: find_spec says None, `import` raises."""
    monkeypatch.setitem(sys.modules, module, None)


def test_extras_name_the_packages_pyproject_declares() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert {name: tuple(pkgs) for name, pkgs in declared.items()} == extras.EXTRAS
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    assert not {"matplotlib", "pandas"} & set(dependencies)


def test_installed_extras_are_reported_installed() -> None:
    # The development venv installs every extra (Makefile, PACKAGE_INSTALLS).
    assert extras.installed("chart") and extras.installed("pandas")


def test_a_chart_without_matplotlib_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _uninstall(monkeypatch, "matplotlib")
    assert not extras.installed("chart")
    with pytest.raises(MissingExtraError, match=r"pip install 'mdclient\[chart\]'") as caught:
        candlestick_png(empty_candles(), tmp_path / "c.png", title="t", period_seconds=60)
    assert caught.value.extra == "chart"
    assert not (tmp_path / "c.png").exists()


def test_to_pandas_without_pandas_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    result = HistoryResult(
        table=empty_candles(), status="NOT_FOUND", request_id="r", attempts=1, elapsed_s=0.0
    )
    _uninstall(monkeypatch, "pandas")
    with pytest.raises(MissingExtraError, match=r"pip install 'mdclient\[pandas\]'"):
        result.to_pandas()
