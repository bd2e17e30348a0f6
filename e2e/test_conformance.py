"""The second-language conformance suite (e2e/conformance, Node.js) against the platform.

The suite is written from docs/client-guide.md, docs/protocol.md, the gateway's JSON schema and the
.proto alone; this test installs it (`npm ci` from the lockfile, into .cache/, the
npm cache beside it) and runs it with the running platform's endpoints. Any
failed check fails this test with the suite's own report.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.compose_platform import STACK_ENV, STACK_NAME, ComposePlatform
from infra.localstack.endpoints import ENDPOINTS_FILE
from infra.platform.supervisor import Platform, PlatformEndpoints
from infra.testing import skip_or_fail

pytestmark = [pytest.mark.e2e, pytest.mark.stack, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "e2e" / "conformance"
CACHE = REPO / ".cache"
INSTALL_TIMEOUT_S = 600
RUN_TIMEOUT_S = 1200


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed: the conformance suite needs Node.js 20+ and npm"
        skip_or_fail(message)
    return path


def _run(command: list[str], cwd: Path, timeout_s: int, env: dict[str, str] | None = None) -> str:
    """Run `command`; its output, or a test failure showing it."""
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    output = f"{done.stdout}\n{done.stderr}"
    print(output)  # shown with -s
    assert done.returncode == 0, f"{command[0]} exited {done.returncode}:\n{output}"
    return output


def installed_suite() -> Path:
    """node_modules of the suite's lockfile, installed once per lockfile content."""
    npm = _tool("npm")
    lock = (SUITE / "package-lock.json").read_bytes()
    manifest = (SUITE / "package.json").read_bytes()
    digest = hashlib.sha256(lock + manifest).hexdigest()[:16]
    target = CACHE / "conformance" / digest
    modules = target / "node_modules"
    if (modules / ".package-lock.json").exists():
        return modules
    target.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(SUITE / name, target / name)
    _run(
        [npm, "ci", "--no-audit", "--no-fund", "--cache", str(CACHE / "npm")],
        target,
        INSTALL_TIMEOUT_S,
    )
    return modules


@pytest.fixture
def endpoints_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The platform's endpoints.json (docs/protocol.md "Ports and sockets"): the one the
    local platform wrote, or compose's layout for this stack's free host ports (what
    infra/compose/endpoints.json holds for the default ones)."""
    if os.environ.get(STACK_ENV) == STACK_NAME:
        stack: ComposePlatform = request.getfixturevalue("compose_stack")
        path = tmp_path / "endpoints.json"
        path.write_text(stack.endpoints.endpoints_json())
        return path
    platform: Platform = request.getfixturevalue("platform")
    return platform.config.data_dir / ENDPOINTS_FILE


@pytest.mark.timeout(1800)  # the platform's start, the install and the suite
def test_conformance_suite_passes(
    endpoints: PlatformEndpoints, gateway: str, endpoints_file: Path
) -> None:
    node = _tool("node")
    modules = installed_suite()
    env = {
        **os.environ,
        "NODE_PATH": str(modules),  # the suite's require()s resolve here (CommonJS)
        "MDP_REQUEST_ENDPOINT": endpoints.request.split(",")[0],
        "MDP_MARKET_DATA_ENDPOINT": endpoints.market_data.split(",")[0],
        "MDP_GATEWAY_URL": gateway,
        "MDP_PROTO": str(REPO / "proto" / "marketdata.proto"),
        "MDP_ENDPOINTS_FILE": str(endpoints_file),
    }
    # Any failed check fails the run: the assertion shows the suite's whole report.
    _run(
        [node, "--test", "--test-concurrency=1", "--test-reporter=spec", "test/"],
        SUITE,
        RUN_TIMEOUT_S,
        env,
    )
