"""`infra.testing`: `skip_or_fail` (a test whose tool cannot be had, Chromium, promtool,
Node.js, is skipped on a developer's machine and fails under CI=true, so that a CI run
never passes without it) and `poll_until`'s failure, which says what was last seen."""

from __future__ import annotations

import pytest

from infra.testing import in_ci, poll_until, skip_or_fail


@pytest.mark.parametrize("value", ["true", "1", "yes", " True "])
def test_ci_is_any_true_value(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci()


@pytest.mark.parametrize("value", ["", "false", "0"])
def test_ci_is_off_otherwise(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert not in_ci()


def test_a_missing_tool_skips_with_a_warning_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with (
        pytest.warns(UserWarning, match=r"^BROWSER TEST NOT RUN: no chromium$"),
        pytest.raises(pytest.skip.Exception, match=r"^BROWSER TEST NOT RUN: no chromium$"),
    ):
        skip_or_fail("BROWSER TEST NOT RUN: no chromium")


def test_a_missing_tool_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true and BROWSER TEST NOT RUN: no"):
        skip_or_fail("BROWSER TEST NOT RUN: no chromium")


def test_poll_until_returns_the_first_truthy_value() -> None:
    values = iter([0, None, 7, 8])
    assert poll_until("a value", lambda: next(values), 60, 0) == 7


def test_poll_until_names_what_and_the_last_seen_detail() -> None:
    with pytest.raises(AssertionError, match=r"^the group stable not within 0 s: REBALANCING$"):
        poll_until("the group stable", lambda: 0, 0, 0, detail=lambda: "REBALANCING")
