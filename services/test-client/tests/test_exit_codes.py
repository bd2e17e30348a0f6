"""One table of exit codes: `mdclient --help` prints it, the README's "Exit codes" table
says the same, and every SDK error has the code the README's "Errors" table names."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from mdclient import errors
from mdclient.cli import main
from mdclient.exit_codes import ERRORS, TABLE, ExitCode, for_error, help_section

ROOT = Path(__file__).resolve().parents[3]
CLIENT_README = ROOT / "services" / "test-client" / "README.md"
#: Prose that names a CLI exit code ("exits 6", "exit 11"), not a time ("exited 6.0 s").
PROSE_DOCS = (CLIENT_README, ROOT / "README.md", ROOT / "docs" / "client-guide.md")
_EXIT_IN_PROSE = re.compile(r"\bexits? (\d+)\b(?![.\d])")


def _table_rows(text: str, section: str) -> list[list[str]]:
    """The cells of each row of the first Markdown table under `section`."""
    after = text.split(f"\n{section}\n", 1)[1]
    rows = []
    started = False
    for line in after.splitlines():
        if line.startswith("|"):
            started = True
            cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
            rows.append([c.strip() for c in cells])
        elif started:
            break
    return rows[2:]  # below the header and its rule


def _sdk_errors() -> list[type[errors.MdClientError]]:
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.MdClientError) and cls is not errors.MdClientError
    ]


def test_the_table_has_every_code_once_in_order() -> None:
    assert [code for code, _ in TABLE] == list(ExitCode)


def test_help_prints_the_table(capsys: Any) -> None:
    assert main(["--help"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert help_section() in out
    for code, meaning in TABLE:  # each meaning, as argparse prints it, next to its code
        first_words = " ".join(meaning.replace("`", "").split()[:3])
        assert re.search(rf"^ +{code.value}  {re.escape(first_words)}", out, re.MULTILINE)


def test_the_readme_exit_codes_table_is_the_table() -> None:
    rows = _table_rows(CLIENT_README.read_text(), "### Exit codes")
    assert [(int(code), meaning) for code, meaning in rows] == [
        (code.value, meaning) for code, meaning in TABLE
    ]


def test_every_sdk_error_has_its_own_code() -> None:
    """A new error in mdclient.errors must be placed in the table on purpose."""
    missing = [cls.__name__ for cls in _sdk_errors() if cls not in ERRORS]
    assert missing == []
    assert all(code != ExitCode.INTERNAL for code in ERRORS.values())


def test_the_readme_errors_table_names_every_error_with_its_code() -> None:
    named: dict[str, int] = {}
    for exceptions, _, exit_code in _table_rows(CLIENT_README.read_text(), "### Errors"):
        main_names = exceptions.split("(")[0]  # "`A` (`Base`)": the base is a hint
        for name in re.findall(r"`(\w+)`", main_names):
            named[name] = int(exit_code)
    assert named == {cls.__name__: ERRORS[cls].value for cls in _sdk_errors()}


def test_an_error_defined_elsewhere_takes_its_nearest_listed_base() -> None:
    class CommandLineError(errors.InvalidRequest):  # as `mdclient trigger` does
        pass

    assert for_error(CommandLineError("x")) == ExitCode.USAGE
    assert for_error(errors.FeedRefused("x")) == ExitCode.REJECTED  # not its base's 4
    assert for_error(RuntimeError("bug")) == ExitCode.INTERNAL


@pytest.mark.parametrize("doc", PROSE_DOCS, ids=lambda p: p.name)
def test_every_exit_code_the_docs_name_is_in_the_table(doc: Path) -> None:
    named = {int(n) for n in _EXIT_IN_PROSE.findall(doc.read_text())}
    assert named <= {code.value for code in ExitCode}
