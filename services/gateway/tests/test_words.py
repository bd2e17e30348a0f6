"""The page's words (static/words.json) cover every enum name it can show and every
error code docs/protocol.md lists, and the gateway's own codes are the documented ones."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from google.protobuf.descriptor import EnumDescriptor

from gateway.app import STATIC
from mdproto.messages import FeedStatus, HistorySource, Status, TakerSide

WORDS = json.loads((STATIC / "words.json").read_text())
PROTOCOL = (Path(__file__).parents[3] / "docs" / "protocol.md").read_text()
GATEWAY_SOURCES = sorted((Path(__file__).parents[1] / "src" / "gateway").glob("*.py"))
SDK_SOURCES = sorted((Path(__file__).parents[2] / "test-client" / "src" / "mdclient").glob("*.py"))
#: SDK codes that never reach a gateway client, and why.
_SDK_ONLY = {
    "wrong_id": "a trigger ack for another trigger: the gateway registers no triggers",
    "snapshot_gone": "history then reads the current snapshot (Client.history)",
}
#: Fields of an error body or frame that the tables mention beside the codes.
_FIELDS = {"reason", "notification", "request_id", "topic"}

ENUMS: dict[str, EnumDescriptor] = {
    "status": Status.DESCRIPTOR,
    "source": HistorySource.DESCRIPTOR,
    "feed_state": FeedStatus.State.DESCRIPTOR,
    "side": TakerSide.DESCRIPTOR,
}


def documented_codes() -> set[str]:
    """Every code in an `error_code` column of "Reply and error codes (every channel)"."""
    section = PROTOCOL.split("## Reply and error codes (every channel)")[1].split("\n## ")[0]
    codes: set[str] = set()
    for table in re.findall(r"(?:^\|.*\|\n)+", section, re.M):
        rows = [row.strip().strip("|").split(" | ") for row in table.strip().splitlines()]
        header = [cell.strip() for cell in rows[0]]
        if "error_code" not in header:
            continue
        column = header.index("error_code")
        for row in rows[2:]:
            if not row[column].startswith("(empty"):  # "(empty; reason = ...)": no code
                codes |= set(re.findall(r"`([a-z][a-z0-9_]*)`", row[column]))
    return codes - _FIELDS


def gateway_codes() -> set[str]:
    """The codes the gateway's own code sends (literals and `or` fallbacks)."""
    pattern = re.compile(
        r'(?:GatewayError\(|error_frame\(|error_response\(\d+, |or )\s*"([a-z][a-z0-9_]*)"'
    )
    return {code for path in GATEWAY_SOURCES for code in pattern.findall(path.read_text())}


@pytest.mark.parametrize("group", sorted(ENUMS))
def test_every_enum_name_has_words(group: str) -> None:
    names = {value.name for value in ENUMS[group].values}
    assert set(WORDS[group]) == names
    assert all(text and text != name for name, text in WORDS[group].items())


def test_the_sequence_kinds_have_words() -> None:
    kinds = re.search(r"`kind` \(([^)]*)\)", PROTOCOL.split("| `sequence` |")[1])
    assert kinds is not None
    assert set(WORDS["sequence"]) == {k.strip() for k in kinds.group(1).split(",")}


def test_the_page_has_words_for_exactly_the_documented_error_codes() -> None:
    documented = documented_codes()
    assert len(documented) > 50  # the parser found the tables
    assert set(WORDS["error_code"]) == documented
    assert all(WORDS["error_code"].values())


def test_every_code_the_gateway_sends_is_documented() -> None:
    sent = gateway_codes()
    assert {"bad_request", "bad_topic", "bad_format", "unauthorized", "internal"} <= sent
    assert sent <= documented_codes(), sent - documented_codes()


def test_every_sdk_code_the_gateway_passes_on_is_documented() -> None:
    pattern = re.compile(r'error_code="([a-z][a-z0-9_]*)"')
    sdk = {code for path in SDK_SOURCES for code in pattern.findall(path.read_text())}
    assert {"relay_unavailable", "history_timeout", "bad_time"} <= sdk  # the scan found them
    assert sdk - set(_SDK_ONLY) <= documented_codes(), sdk - set(_SDK_ONLY) - documented_codes()
