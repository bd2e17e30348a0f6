"""The page's words (static/words.json) cover every enum name it can show and every
error code of the vocabulary (mdproto.error_codes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from google.protobuf.descriptor import EnumDescriptor

from gateway.app import STATIC
from mdproto.error_codes import VOCABULARY
from mdproto.messages import BookReset, FeedStatus, HistorySource, Status, TakerSide

WORDS = json.loads((STATIC / "words.json").read_text())
PROTOCOL = (Path(__file__).parents[3] / "docs" / "protocol.md").read_text()
ENUMS: dict[str, EnumDescriptor] = {
    "status": Status.DESCRIPTOR,
    "source": HistorySource.DESCRIPTOR,
    "feed_state": FeedStatus.State.DESCRIPTOR,
    "side": TakerSide.DESCRIPTOR,
    "book_reset": BookReset.DESCRIPTOR,
}


@pytest.mark.parametrize("group", sorted(ENUMS))
def test_every_enum_name_has_words(group: str) -> None:
    names = {value.name for value in ENUMS[group].values}
    assert set(WORDS[group]) == names
    assert all(text and text != name for name, text in WORDS[group].items())


def test_the_sequence_kinds_have_words() -> None:
    kinds = re.search(r"`kind` \(([^)]*)\)", PROTOCOL.split("| `sequence` |")[1])
    assert kinds is not None
    assert set(WORDS["sequence"]) == {k.strip() for k in kinds.group(1).split(",")}


def test_the_book_event_kinds_have_words() -> None:
    kinds = re.search(r"`kind` \(([^)]*)\)", PROTOCOL.split("| `book_event` |")[1])
    assert kinds is not None
    assert set(WORDS["book_event"]) == {k.strip() for k in kinds.group(1).split(",")}
    assert all(text and text != kind for kind, text in WORDS["book_event"].items())


def test_the_page_has_words_for_every_error_code() -> None:
    """The vocabulary is the list of codes (proto/tests/test_error_codes.py keeps it
    equal to docs/protocol.md and to what every service sends)."""
    assert set(WORDS["error_code"]) == set(VOCABULARY)
    assert all(text and text != code for code, text in WORDS["error_code"].items())
