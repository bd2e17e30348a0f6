"""The error vocabulary is complete: every code the source sends is in it, and
docs/protocol.md documents exactly its codes."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from mdproto import ProtocolError, error_codes
from mdproto.error_codes import VOCABULARY, Carrier

ROOT = Path(__file__).resolve().parents[2]
SOURCE_TREES = [ROOT / "proto" / "src", *sorted((ROOT / "services").glob("*/src"))]
PROTOCOL_MD = ROOT / "docs" / "protocol.md"
SECTION = "## Reply and error codes (every channel)"
TABLE_HEADER = "| error_code | carried by | meaning |"

_CODE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")
_CODE_FIELDS = frozenset({"error_code", "code"})
# Callables whose snake_case string arguments are codes (reasons contain spaces).
_CODE_TAKERS = frozenset({"error_frame", "error_response", "Reject"})


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_code_field(node: ast.expr) -> bool:
    """`x.error_code`, `x.code` or `getattr(x, "error_code", ...)`."""
    if isinstance(node, ast.Attribute):
        return node.attr in _CODE_FIELDS
    if isinstance(node, ast.Call) and _name(node.func) == "getattr" and len(node.args) > 1:
        field = node.args[1]
        return isinstance(field, ast.Constant) and field.value in _CODE_FIELDS
    return False


def _literal(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def codes_sent(source: str) -> Iterator[tuple[int, str, bool]]:
    """(line, code, literal) for every string literal the source uses as an error code
    (literal True) and every name it takes from `mdproto.error_codes`. Text inside an
    f-string is for humans (`f"{code or 'error'}: ..."`), not a code."""
    tree = ast.parse(source)
    in_text = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FormattedValue)
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in in_text:
            continue
        candidates: list[ast.expr | None] = []
        if isinstance(node, ast.Call):
            callee = _name(node.func)
            candidates += [k.value for k in node.keywords if k.arg in _CODE_FIELDS]
            if callee.endswith(("Error", "Violation")) and node.args:
                candidates.append(node.args[0])
            if callee in _CODE_TAKERS:
                candidates += node.args
        elif isinstance(node, ast.BoolOp) and _is_code_field(node.values[0]):
            candidates += node.values[1:]
        elif isinstance(node, ast.Compare) and _is_code_field(node.left):
            candidates += node.comparators
        elif isinstance(node, ast.Dict):
            candidates += [
                v
                for k, v in zip(node.keys, node.values, strict=True)
                if _literal(k) == "error_code"
            ]
        elif isinstance(node, ast.Assign) and any(_is_code_field(t) for t in node.targets):
            candidates.append(node.value)
        elif isinstance(node, ast.ImportFrom) and node.module == "mdproto.error_codes":
            for alias in node.names:
                if alias.name.isupper() and alias.name != "VOCABULARY":
                    yield node.lineno, getattr(error_codes, alias.name, alias.name), False
        elif (
            isinstance(node, ast.Attribute)
            and _name(node.value) == "error_codes"
            and node.attr.isupper()
        ):
            yield node.lineno, getattr(error_codes, node.attr, node.attr), False
        for candidate in candidates:
            text = _literal(candidate)
            if text is not None and _CODE.match(text):
                yield getattr(candidate, "lineno", node.lineno), text, True


def code_constants(source: str) -> Iterator[tuple[int, str]]:
    """(line, NAME) for every UPPER_CASE name bound to a code's string: a definition
    that belongs in mdproto.error_codes."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and _literal(node.value) in VOCABULARY:
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.isupper():
                    yield node.lineno, target.id


def _sources() -> Iterator[tuple[str, str]]:
    for tree in SOURCE_TREES:
        for path in sorted(tree.rglob("*.py")):
            if "gen" not in path.relative_to(tree).parts:
                yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")


def test_the_scan_finds_codes_in_every_form_they_are_sent() -> None:
    source = """
from mdproto.error_codes import NO_INGESTOR
from mdproto import error_codes
raise ProtocolError("frame_count", "two frames, not three")
raise MdClientError("no answer", error_code="submit_timeout")
reply = Response(status=3, reason="it broke", error_code="internal")
fail(exc.error_code or "feed_unavailable", exc.reason)
code = getattr(exc, "error_code", "") or "unavailable"
if exc.error_code != "snapshot_gone":
    pass
body = {"error_code": "unauthorized", "reason": "no token"}
error_response(400, "bad_format", "format must be json")
rejects.append(Reject(1, 2, "bad_row", "a row without a ticker"))
meta.error_code = "incomplete"
ok = error_codes.SINK_ERROR
raise ValueError("not a code, a sentence")
line = f", {note.error_code or 'error'}: {note.reason}"
from mdproto.error_codes import VOCABULARY, Carrier
"""
    found = {code: literal for _, code, literal in codes_sent(source)}
    assert sorted(found) == sorted(
        [
            "no_ingestor",
            "frame_count",
            "submit_timeout",
            "internal",
            "feed_unavailable",
            "unavailable",
            "snapshot_gone",
            "unauthorized",
            "bad_format",
            "bad_row",
            "incomplete",
            "sink_error",
        ]
    )
    assert not found["no_ingestor"] and not found["sink_error"] and found["bad_row"]
    assert list(code_constants('TIMEOUT = "timeout"\nQUERY = "history"\n')) == [(1, "TIMEOUT")]


def test_every_code_the_source_sends_is_in_the_vocabulary() -> None:
    unknown = [
        f"{path}:{line}: {code!r}"
        for path, source in _sources()
        for line, code, _ in codes_sent(source)
        if code not in VOCABULARY
    ]
    assert not unknown, "add these to mdproto/error_codes.py (and docs/protocol.md):\n" + "\n".join(
        unknown
    )


def test_codes_are_named_by_their_constants() -> None:
    literals = [
        f"{path}:{line}: {code!r}"
        for path, source in _sources()
        for line, code, literal in codes_sent(source)
        if literal
    ]
    assert not literals, "use the constants of mdproto.error_codes:\n" + "\n".join(literals)


def test_codes_are_defined_only_in_the_vocabulary() -> None:
    elsewhere = [
        f"{path}:{line}: {name}"
        for path, source in _sources()
        if not path.endswith("mdproto/error_codes.py")
        for line, name in code_constants(source)
    ]
    assert not elsewhere, "import these from mdproto.error_codes instead:\n" + "\n".join(elsewhere)


def test_protocol_errors_carry_the_frame_codes() -> None:
    assert error_codes.carried_by(Carrier.FRAME) == ProtocolError.CODES
    assert {"bad_ticker", "bad_status", "unexpected_type"} <= ProtocolError.CODES


def _section() -> str:
    text = PROTOCOL_MD.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end != -1 else len(text)]


def _tables(section: str) -> Iterator[list[list[str]]]:
    """Each markdown table as rows of cells, the header first, the rule line dropped."""
    table: list[list[str]] = []
    for line in [*section.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not all(set(c) <= set("-: ") for c in cells):
                table.append(cells)
        elif table:
            yield table
            table = []


def _row(code: str) -> str:
    entry = VOCABULARY[code]
    carriers = " ".join(c.value for c in Carrier if c in entry.carriers)
    return f"| `{code}` | {carriers} | {entry.meaning} |"


def test_the_docs_table_lists_exactly_the_vocabulary() -> None:
    section = _section()
    assert TABLE_HEADER in section, f"docs/protocol.md {SECTION!r} needs the table {TABLE_HEADER}"
    documented = {
        line.split("|")[1].strip().strip("`"): line.strip()
        for line in section[section.index(TABLE_HEADER) :].splitlines()[2:]
        if line.startswith("| `")
    }
    missing = sorted(set(VOCABULARY) - set(documented))
    extra = sorted(set(documented) - set(VOCABULARY))
    assert not missing, "add to docs/protocol.md:\n" + "\n".join(_row(c) for c in missing)
    assert not extra, f"not in mdproto.error_codes: {extra}"
    wrong = [_row(c) for c, line in documented.items() if line != _row(c)]
    assert not wrong, "make these docs/protocol.md rows read:\n" + "\n".join(wrong)


def test_every_code_in_the_channel_tables_is_in_the_vocabulary() -> None:
    named: set[str] = set()
    for table in _tables(_section()):
        header, *rows = table
        columns = [i for i, cell in enumerate(header) if cell == "error_code"]
        for row in rows:
            for i in columns:
                named.update(t for t in re.findall(r"`([^`]+)`", row[i]) if _CODE.match(t))
    assert len(named) > 40, "the scan of the channel tables found too few codes"
    assert named <= set(VOCABULARY), sorted(named - set(VOCABULARY))


@pytest.mark.parametrize("carrier", list(Carrier))
def test_every_channel_originates_some_code(carrier: Carrier) -> None:
    assert error_codes.carried_by(carrier)
