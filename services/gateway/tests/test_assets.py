"""The chart library without npm (the image build's path): the registry's tarball URL,
served by a real HTTP server here, unpacked only when its digest is the pinned one."""

from __future__ import annotations

import io
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gateway import assets

BUNDLE = b"/* lightweight-charts stand-in */"


def _tarball() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for member, body in (
            ("package/dist/lightweight-charts.standalone.production.js", BUNDLE),
            ("package/LICENSE", b"Apache-2.0"),
        ):
            info = tarfile.TarInfo(member)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    return out.getvalue()


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """An npm-registry-shaped server of one tarball; npm itself hidden. Yields the paths asked."""
    body = _tarball()
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            found = self.path == f"/{assets.PACKAGE}/-/{assets.TARBALL}"
            self.send_response(200 if found else 404)
            self.end_headers()
            if found:
                self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", f"http://127.0.0.1:{server.server_address[1]}/")
    monkeypatch.setattr(assets.shutil, "which", lambda _name: None)
    try:
        yield asked
    finally:
        server.shutdown()
        server.server_close()


def test_without_npm_the_pinned_tarball_comes_from_the_registry_url(
    registry: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(assets, "INTEGRITY", assets.integrity_of(_tarball()))
    path = assets.fetch(tmp_path)
    assert path.read_bytes() == BUNDLE
    assert (tmp_path / "lightweight-charts.LICENSE").read_bytes() == b"Apache-2.0"
    assert registry == [f"/{assets.PACKAGE}/-/{assets.TARBALL}"]


def test_a_tarball_with_another_digest_is_refused_and_nothing_unpacked(
    registry: list[str], tmp_path: Path
) -> None:
    with pytest.raises(RuntimeError, match="is not the pinned"):
        assets.fetch(tmp_path / "vendor")
    assert not (tmp_path / "vendor").exists()


def test_a_registry_without_the_tarball_is_reported(
    registry: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", assets.registry() + "/elsewhere")
    with pytest.raises(RuntimeError, match=r"cannot download http://\S+/elsewhere/.*404"):
        assets.fetch(tmp_path)
    assert registry == [f"/elsewhere/{assets.PACKAGE}/-/{assets.TARBALL}"]
