"""`python -m gateway.assets`: the chart library, fetched once from the npm registry.

TradingView's lightweight-charts (Apache-2.0) at a pinned version and tarball
digest, unpacked into the package's static/vendor/ (git-ignored); the page loads it
from the gateway, never from a CDN. `make gateway-assets` (run by `make run` and
`make test`) calls this; it does nothing when the file is already there.

The tarball comes from `npm pack` where npm is installed, else straight from the
registry's tarball URL (the gateway image's build stage has no npm): the same
file either way, checked against the same pinned digest. `NPM_CONFIG_REGISTRY`
(npm's own variable) names a mirror for both.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

PACKAGE = "lightweight-charts"
VERSION = "5.2.1"
#: The registry's `dist.integrity` of that version (npm view lightweight-charts@5.2.1).
INTEGRITY = (
    "sha512-IVwoK1RLFiLPubaKIjNbtjWLnpPMqiABSrTay6whmNa8L1+19292VtHJ+"
    "BWyPUuLCwF0tcQlhEWd1CLB2a1nsQ=="
)
MEMBERS = {
    "package/dist/lightweight-charts.standalone.production.js": (
        "lightweight-charts.standalone.production.js"
    ),
    "package/LICENSE": "lightweight-charts.LICENSE",
}
VENDOR = Path(__file__).parent / "static" / "vendor"
DEFAULT_REGISTRY = "https://registry.npmjs.org"
TARBALL = f"{PACKAGE}-{VERSION}.tgz"


def integrity_of(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def registry() -> str:
    return (os.environ.get("NPM_CONFIG_REGISTRY") or DEFAULT_REGISTRY).rstrip("/")


def npm_pack(npm: str, directory: Path) -> Path:
    spec = f"{PACKAGE}@{VERSION}"
    done = subprocess.run(
        [npm, "pack", spec, "--silent", "--pack-destination", str(directory)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"npm pack {spec} failed: {done.stderr.strip()[-500:]}")
    return directory / TARBALL


def download(directory: Path) -> Path:
    """The registry's tarball URL (`dist.tarball` of the version), without npm."""
    url = f"{registry()}/{PACKAGE}/-/{TARBALL}"
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            data = response.read()
    except (urllib.error.URLError, TimeoutError) as exc:
        raise RuntimeError(f"cannot download {url}: {exc}") from exc
    target = directory / TARBALL
    target.write_bytes(data)
    return target


def fetch(vendor: Path = VENDOR) -> Path:
    """The library in `vendor`, fetched unless present; RuntimeError says why not."""
    target = vendor / MEMBERS["package/dist/lightweight-charts.standalone.production.js"]
    if target.is_file():
        target.touch()  # newer than assets.py: make sees it done
        return target
    npm = shutil.which("npm")
    with tempfile.TemporaryDirectory() as tmp:
        tarball = npm_pack(npm, Path(tmp)) if npm else download(Path(tmp))
        got = integrity_of(tarball.read_bytes())
        if got != INTEGRITY:
            raise RuntimeError(f"{tarball.name}: digest {got} is not the pinned {INTEGRITY}")
        vendor.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tarball) as archive:
            for member, name in MEMBERS.items():
                try:
                    source = archive.extractfile(member)
                except KeyError:
                    source = None
                if source is None:
                    raise RuntimeError(f"{tarball.name} holds no {member}")
                (vendor / f".{name}.part").write_bytes(source.read())
                (vendor / f".{name}.part").replace(vendor / name)
    return target


def main() -> int:
    try:
        path = fetch()
    except (RuntimeError, OSError, subprocess.TimeoutExpired, tarfile.TarError) as exc:
        print(f"gateway assets: {exc}", file=sys.stderr)
        return 1
    print(f"gateway assets: {PACKAGE} {VERSION} in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
