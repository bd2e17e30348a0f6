"""`python -m infra.platform run|stop|status` (what `make run` and `make stop` call).

`run` starts everything, waits for readiness, answers one real history request
through the `mdclient` CLI (rows printed, candlestick chart written), then keeps
the platform running until Ctrl-C or `stop`, restarting a component that crashes
or hangs (`supervise`; hung: `infra.platform.liveness`; when it gives up:
`infra.platform.restarts`), or stops at once with `--once`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from infra.localstack.components import base_env
from infra.localstack.process import (
    ExitWatcher,
    PidFile,
    ProcessRecord,
    StackError,
    _proc_start_ticks,
    log_tail,
)
from infra.localstack.stack import ComponentStatus
from infra.platform.config import PlatformConfig
from infra.platform.console import tolerate_closed_streams
from infra.platform.liveness import Hung, LivenessPolicy, Probe, healthz
from infra.platform.restarts import GiveUp, RestartPolicy
from infra.platform.services import BIN
from infra.platform.supervisor import Platform, PlatformEndpoints
from ingestor.venues import venue_for

Say = Callable[[str], None]
#: The `run` process's own pid file under `<data>/run/`, for `stop`.
SUPERVISOR_PID_FILE = "platform.pid"
#: Lines of a crashed component's log shown on the console.
LOG_TAIL_LINES = 10


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def history_demo(
    endpoints: PlatformEndpoints, data_dir: Path, ticker: str, period: str, start: str
) -> int:
    """Ask for history exactly as a user would: through the mdclient CLI."""
    chart = data_dir / "charts" / f"{ticker.replace(':', '_').replace('/', '-')}-{period}.png"
    chart.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(BIN / "mdclient"), "history", ticker, "--period", period, "--start", start]
    argv += ["--chart", str(chart)]
    _say(f"[platform] history request: {' '.join(argv[1:])}")
    env = {**base_env(), **endpoints.client_env()}
    t0 = time.monotonic()
    code = subprocess.call(argv, env=env)
    took = time.monotonic() - t0
    if code == 0:
        _say(f"[platform] answered from Iceberg in {took:.1f} s; chart: {chart}")
    else:
        _say(f"[platform] history request failed with exit code {code} after {took:.1f} s")
    return code


def _print_status(platform: Platform) -> None:
    print(f"{'component':<15} {'state':<15} {'pid':>8} {'RSS MiB':>8}  address")
    for s in platform.status():
        pid = str(s.pid) if s.pid is not None else "-"
        rss = f"{s.rss_bytes / 2**20:.0f}" if s.rss_bytes else "-"
        print(f"{s.name:<15} {s.state:<15} {pid:>8} {rss:>8}  {s.address}")
    print(f"\n{metrics_lines(platform)}")


def metrics_lines(platform: Platform) -> str:
    """Where each service's `/metrics` and `/healthz` are, one line each."""
    urls = platform.metrics_urls().items()
    return "GET /metrics and /healthz:\n" + "\n".join(
        f"  {name:<15} {url}/metrics  {url}/healthz" for name, url in urls
    )


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM (e.g. from `make stop`) shuts down like Ctrl-C."""
    raise KeyboardInterrupt


def describe_exit(code: int | None) -> str:
    """An exit status for people: `exit code 1`, `killed by SIGKILL`."""
    if code is None:
        return "exit status unknown: not started by this process"
    if code >= 0:
        return f"exit code {code}"
    with contextlib.suppress(ValueError):
        return f"killed by {signal.Signals(-code).name}"
    return f"killed by signal {-code}"


def _recover(
    platform: Platform, policy: RestartPolicy, row: ComponentStatus, what: str, say: Say
) -> str:
    """Say what happened to `row` (`what`: "died (exit code 1)") with the end of its log,
    and restart it until it is ready or `policy` gives up ("" if it runs again, else why
    the platform stops). A failed start counts as a crash."""
    tail = textwrap.indent(log_tail(row.log_file, LOG_TAIL_LINES), "  | ", lambda _: True)
    say(f"[platform] {row.name} {what}; last lines of {row.log_file}:\n{tail}")
    while True:
        action = policy.crashed(row.name)
        if isinstance(action, GiveUp):
            return (
                f"{row.name} crashed {action.crashes} times within {action.window_s:g} s;"
                " giving up (PLATFORM_CRASH_LIMIT, PLATFORM_CRASH_WINDOW_S)"
            )
        say(
            f"[platform] restarting {row.name} (crash {action.crashes} within"
            f" {policy.window_s:g} s; at {action.limit} the platform stops)"
        )
        try:
            platform.restart(row.name)
        except StackError as exc:
            say(f"[platform] {row.name} did not start again: {exc}")
            continue
        say(f"[platform] {row.name} is ready again")
        return ""


def _died(platform: Platform, row: ComponentStatus) -> str:
    cause = describe_exit(platform.exit_status(row.pid)) if row.pid is not None else "gone"
    return f"died ({cause})"


def _hung(platform: Platform, hung: Hung) -> str | None:
    """Kill a hung component (SIGKILL ends a stopped process too) and say why; None if
    it was gone already (the crash path then takes it)."""
    try:
        platform.kill(hung.component)
    except StackError:
        return None
    return (
        f"is hung (/healthz unanswered {hung.failures} times in a row over {hung.for_s:.0f} s,"
        f" last: {hung.reason}); killed it"
    )


def supervise(
    platform: Platform,
    stop: threading.Event,
    clock: Callable[[], float] = time.monotonic,
    *,
    say: Say = _say,
    poll_s: float = 1.0,
    probe: Probe = healthz,
) -> str:
    """Keep the platform running: restart each component that crashes, or that serves
    `/healthz` and fails its liveness probe (`infra.platform.liveness`), as
    `infra.platform.restarts` decides, until `stop` is set ("") or the platform must
    stop (the reason). Ctrl-C and SIGTERM interrupt it (KeyboardInterrupt)."""
    config = platform.config
    policy = RestartPolicy(config.crash_limit, config.crash_window_s, clock)
    liveness = LivenessPolicy(config.liveness_period_s, config.liveness_failures, clock)
    probed = platform.metrics_urls()  # the services with a /healthz
    while not stop.wait(poll_s):
        for row in platform.status(memory=False):
            if row.state == "stopped":  # its pid file removed: a `down` elsewhere, no crash
                return f"{row.name} was stopped by another process"
            what = None
            if row.state != "running":
                what = _died(platform, row)
            elif row.name in probed and liveness.due(row.name):
                hung = liveness.probed(row.name, probe(probed[row.name]))
                what = _hung(platform, hung) if hung is not None else None
            if what is None:
                continue
            if reason := _recover(platform, policy, row, what, say):
                return reason
            liveness.forget(row.name)
    return ""


def _wait_for_ctrl_c(platform: Platform) -> str:
    """Say how to use the running platform, then `supervise` it: KeyboardInterrupt on
    Ctrl-C or SIGTERM, else the reason it must stop."""
    e = platform.endpoints
    _say(
        "\n[platform] running. Open the live chart in a browser:\n"
        f"  {e.gateway}/?ticker={platform.config.prefixes[0]}:BTC/USDT\n"
        "Or try, in another shell (the client needs no settings: the relay and the\n"
        "catalog are at their defaults, and the catalog tells it where the files are):\n"
        f"  .venv/bin/mdclient live {platform.config.prefixes[0]}:BTC/USDT --ticks"
        f"     (relay {e.request})\n"
        f"  .venv/bin/mdclient history {platform.config.prefixes[0]}:ETH/USDT --period 1m"
        " --start -3h\n"
        f"  .venv/bin/mdclient markets {platform.config.prefixes[0]}\n"
        f"  curl -s {e.relay_metrics}/metrics | grep relay_\n"
        f"  logs: {platform.config.data_dir / 'logs'}\n"
        f"{metrics_lines(platform)}\n"
        "A component that crashes or hangs is restarted. Ctrl-C stops everything (or `make stop`"
        " from another shell)."
    )
    return supervise(platform, threading.Event())


def default_start(exchange_id: str) -> str:
    """The demo request's start: the last 24 h, or less where the exchange serves only
    its latest entries (Kraken: 720 one-minute ones, so the last 10 h), so that
    `make run EXCHANGES=kraken` answers instead of refusing an older range."""
    return "-24h" if venue_for(exchange_id).history_entries is None else "-10h"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.platform", description=__doc__)
    parser.add_argument("command", choices=["run", "stop", "status"])
    parser.add_argument("--once", action="store_true", help="run: stop after the demo request")
    parser.add_argument("--ticker", help="default: <first exchange's prefix>:BTC/USDT")
    parser.add_argument("--period", default="1m")
    parser.add_argument("--start", help="history start (default: last 24 h; Kraken: 10 h)")
    args = parser.parse_args(argv)
    tolerate_closed_streams()  # `make run | tee`: Ctrl-C ends tee, the shutdown goes on
    config = PlatformConfig()
    args.ticker = args.ticker or f"{config.prefixes[0]}:BTC/USDT"
    args.start = args.start or default_start(config.exchanges[0])

    if args.command != "run":
        platform = Platform(config, use_simulator=True)
        if args.command == "stop":
            _stop_supervisor(config.data_dir)
            platform.down()  # what no supervisor stopped
        else:
            _print_status(platform)
        return 0

    try:
        platform = Platform(config)
    except StackError as exc:  # e.g. an exchange the simulator does not speak
        _say(f"[platform] ERROR: {exc}")
        return 1
    signal.signal(signal.SIGTERM, _interrupt)
    pid_file = PidFile(config.data_dir / "run" / SUPERVISOR_PID_FILE)
    pid_file.write(_this_process())
    try:
        return _run(platform, args)
    finally:
        pid_file.remove()


def _run(platform: Platform, args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        endpoints = platform.up()
    except StackError as exc:
        _say(f"[platform] ERROR: {exc}")
        platform.down()
        return 1
    except KeyboardInterrupt:
        platform.down()
        return 130
    _say(f"[platform] every component ready in {time.monotonic() - t0:.0f} s")
    data_dir = platform.config.data_dir
    try:
        code = history_demo(endpoints, data_dir, args.ticker, args.period, args.start)
        if not args.once and (reason := _wait_for_ctrl_c(platform)):
            _say(f"[platform] {reason}; shutting down")
            code = 1
    except KeyboardInterrupt:
        _say("\n[platform] stopping ...")
        code = 130
    finally:
        platform.down()
    return code


def _this_process() -> ProcessRecord:
    pid = os.getpid()
    ticks = _proc_start_ticks(pid)
    return ProcessRecord("platform", pid, ticks if ticks is not None else -1, {}, "", sys.argv)


def _stop_supervisor(data_dir: Path, timeout_s: float = 120.0) -> None:
    """`make stop` while `make run` supervises: SIGTERM `run` first, so that it stops
    everything itself instead of restarting the components `down` stops under it."""
    record = PidFile(data_dir / "run" / SUPERVISOR_PID_FILE).read()
    if record is None or not record.alive or record.pid == os.getpid():
        return
    watcher = ExitWatcher(record.pid)
    try:
        os.kill(record.pid, signal.SIGTERM)
        if not watcher.wait(timeout_s):
            _say(f"[platform] `run` (pid {record.pid}) still runs after {timeout_s:g} s")
    finally:
        watcher.close()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
