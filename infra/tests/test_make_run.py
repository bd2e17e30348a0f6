"""`make run` is stopped by a SIGTERM to make, whichever way it was started (issue 45,
item 3): a process manager or `timeout` stops a job by signalling the process it
started, and the platform must not outlive it.

GNU make passes a SIGTERM on to its children and waits for them; so the platform
process must be make's own child. The Makefile's real `run` recipe is run here
with `BIN` pointing at a stub `python` that records where it runs and how it was
stopped: the whole platform's shutdown on SIGTERM is `infra.platform`'s own, covered
where it is started for real, so what this adds is the recipe's process structure
and the signal's way through make. Its prerequisites (venv, jars, proto) are taken as
made (`make -o`): the test touches nothing in the checkout.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.localstack.config import REPO_ROOT
from infra.testing import poll_until

STUB = f"""#!{sys.executable}
import json, os, signal, sys

record = os.environ["STUB_RECORD"]


def stopped(signum, frame):
    with open(record + ".stopped", "w") as f:
        f.write(signal.Signals(signum).name)
    sys.exit(0)


signal.signal(signal.SIGTERM, stopped)
state = {{
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "argv": sys.argv[1:],
    "exchanges": os.environ.get("PLATFORM_EXCHANGES"),
}}
with open(record + ".tmp", "w") as f:
    json.dump(state, f)
os.replace(record + ".tmp", record)
while True:
    signal.pause()
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
@pytest.mark.parametrize(
    ("variables", "exchanges", "args"),
    [
        ([], None, []),
        (["EXCHANGES=okx"], "okx", []),
        (
            ["EXCHANGES=okx,kraken", "ARGS=--ticker 'OKX:ETH/USDT' --once"],
            "okx,kraken",
            ["--ticker", "OKX:ETH/USDT", "--once"],
        ),
    ],
    ids=["plain", "exchanges", "exchanges-and-quoted-args"],
)
def test_a_sigterm_to_make_stops_the_platform_process(
    tmp_path: Path, variables: list[str], exchanges: str | None, args: list[str]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    record = tmp_path / "platform.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    env.pop("PLATFORM_EXCHANGES", None)
    env["STUB_RECORD"] = str(record)
    made = ["-o", "jars", "-o", "proto", "-o", "gateway-assets"]
    output = tmp_path / "make.log"
    with output.open("w") as out:
        make = subprocess.Popen(
            ["make", "-s", "-C", str(REPO_ROOT), *made, f"BIN={bin_dir}", *variables, "run"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one group to clean up, whatever the test finds
        )
    try:

        def started() -> dict[str, Any]:
            if make.poll() is not None:
                raise AssertionError(f"make exited {make.returncode}: {output.read_text()}")
            return json.loads(record.read_text()) if record.exists() else {}

        platform = poll_until("the platform process to start", started, 60, 0.05)
        assert platform["ppid"] == make.pid, "a process sits between make and the platform"
        assert platform["argv"] == ["-m", "infra.platform", "run", *args]
        assert platform["exchanges"] == exchanges

        make.send_signal(signal.SIGTERM)
        make.wait(60)
        stopped = tmp_path / "platform.json.stopped"
        assert stopped.exists() and stopped.read_text() == "SIGTERM"
        assert not alive(platform["pid"]), "the platform process outlived make"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(make.pid, signal.SIGKILL)
        make.wait(10)
