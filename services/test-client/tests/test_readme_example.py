"""The README's SDK example calls the SDK as it is: every `client.X(...)` it makes binds
to `Client.X`'s signature, and every attribute it reads exists on what it reads."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

from mdclient import Client, HistoryResult
from mdproto.messages import OHLC

README = Path(__file__).resolve().parents[3] / "README.md"


def _source() -> str:
    text = README.read_text()
    section = text[text.index("## SDK example") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md's SDK example has no python block"
    return match.group(1)


def _example() -> ast.Module:
    return ast.parse(_source())


def test_the_example_is_at_most_ten_lines_and_compiles() -> None:
    compile(_example(), "README.md", "exec")
    assert len([line for line in _source().splitlines() if line.strip()]) <= 10


def test_every_client_call_binds_to_the_sdk() -> None:
    calls = [
        node
        for node in ast.walk(_example())
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "client"
    ]
    assert {call.func.attr for call in calls if isinstance(call.func, ast.Attribute)} == {
        "history",
        "live",
    }
    for call in calls:
        assert isinstance(call.func, ast.Attribute)
        method = getattr(Client, call.func.attr)
        args = [None] * len(call.args)
        kwargs = {k.arg: None for k in call.keywords if k.arg is not None}
        inspect.signature(method).bind(None, *args, **kwargs)


def test_every_attribute_it_reads_exists() -> None:
    read = {
        node.attr
        for node in ast.walk(_example())
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        if node.value.id in {"day", "candle"}
    }
    fields = {f.name for f in dataclasses.fields(HistoryResult)}
    fields |= set(OHLC.DESCRIPTOR.fields_by_name)
    assert read and read <= fields, read - fields
