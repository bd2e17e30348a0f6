"""The mdclient CLI: parsing, exit codes, outputs, live, Ctrl-C (fake relay, no stack)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from mdclient import cli
from mdclient.cli import build_parser, main
from mdclient.cli.args import join_relative_times, parse_range_args, settings_from_args
from mdclient.cli.commands import history
from mdclient.exit_codes import ExitCode
from mdproto import topics
from mdproto.messages import (
    OHLC,
    FeedStatus,
    HistorySource,
    Response,
    Status,
    SubmitResponse,
    Tick,
)

TICKER = "BINANCE:BTC/USDT"
RANGE = ["--start", "2026-11-20T00:00", "--end", "2026-11-20T01:00"]


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONFIG_PATH", raising=False)


def _relay_args(relay: Any) -> list[str]:
    return [
        "--request-endpoint", relay.request_endpoint,
        "--market-data-endpoint", relay.market_data_endpoint,
    ]  # fmt: skip


def _run(relay: Any, *args: str, env: dict[str, str] | None = None) -> int:
    return main([*args, *_relay_args(relay)])


def test_parse_range_args_normalises_ticker_period_and_times() -> None:
    args = build_parser().parse_args(["history", "binance:eth/usdt", "--period", "5m", *RANGE])
    assert parse_range_args(args) == ("BINANCE:ETH/USDT", 300, 1_795_132_800_000, 1_795_136_400_000)
    relative = build_parser().parse_args(
        join_relative_times(["history", TICKER, "--start", "-2h", "--end", "-1h30m"])
    )
    _, _, start, end = parse_range_args(relative)
    assert end - start == 30 * 60_000
    defaults = build_parser().parse_args(["history", TICKER])
    _, period, start, end = parse_range_args(defaults)
    assert (period, end - start) == (60, 86_400_000)  # 1m over the last 24 h
    for given, canonical in (("100Ticks", "100ticks"), ("2.50vol", "2.5vol")):
        bars = build_parser().parse_args(["history", TICKER, "--period", given, *RANGE])
        assert parse_range_args(bars)[1] == canonical  # tick and volume bars


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["history"],
        ["history", "BTCUSDT"],
        ["history", TICKER, "--period", "1y"],
        ["history", TICKER, "--period", "0ticks"],
        ["history", TICKER, "--period", "1e3vol"],
        ["legacy", TICKER, "--period", "100ticks"],
        ["history", TICKER, "--period", "100ticks", "--chart", "/tmp/never-written.png"],
        ["history", TICKER, "--start", "now", "--end", "-1h"],
        ["history", TICKER, "--start", "1795132800"],
        ["history", TICKER, "--attempts", "0"],
        ["history", TICKER, "--timeout", "abc"],
        ["history", TICKER, "--csv", "/no/such/folder/x.csv"],
        ["live", TICKER, "--ohlc", "fortnight"],
        ["bogus"],
    ],
)
def test_usage_errors_exit_2_before_any_network(argv: list[str], capsys: Any) -> None:
    # Relay endpoints point nowhere: reaching the network would give 7, not 2.
    code = main([*argv, "--request-endpoint", "tcp://127.0.0.1:9"] if len(argv) > 1 else argv)
    assert code == ExitCode.USAGE
    assert capsys.readouterr().err  # says why


def test_chart_without_the_chart_extra_says_how_to_install_it_before_any_network(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    chart = tmp_path / "c.png"
    nowhere = ["--request-endpoint", "tcp://127.0.0.1:9"]
    code = main(["history", TICKER, *RANGE, "--chart", str(chart), *nowhere])
    assert code == ExitCode.USAGE  # 7 (unavailable) had it tried the relay
    err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert "--chart" in err and "matplotlib" in err
    assert "pip install 'mdclient[chart]'" in err
    assert not chart.exists()


def test_help_exits_0(capsys: Any) -> None:
    assert main(["--help"]) == ExitCode.OK
    assert "Exit codes" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "{config}", "-q", "history", TICKER, "--client-id", "c1"],
        ["history", TICKER, "--config", "{config}", "-q", "--client-id", "c1"],
        ["--config", "{config}", "history", TICKER, "-q", "--client-id", "c1"],
        ["-q", "--client-id", "c1", "status", "r1", "--config", "{config}"],
        ["--client-id", "c1", "--config", "{config}", "-q", "trigger", "list"],
    ],
    ids=["before", "after", "mixed", "status", "trigger"],
)
def test_options_before_or_after_the_command_both_work(tmp_path: Path, argv: list[str]) -> None:
    """docs/docker.md's `mdclient --config FILE history ...` (issue 47): an option given
    before the command is kept, not reset by the command's own default."""
    config = tmp_path / "c.yaml"
    config.write_text("request_endpoint: tcp://10.0.0.1:5559\n")
    args = build_parser().parse_args([a.format(config=config) for a in argv])
    settings = settings_from_args(args)
    assert (settings.request_endpoint, settings.client_id, args.quiet) == (
        "tcp://10.0.0.1:5559",
        "c1",
        True,
    )


def test_an_option_after_the_command_wins_over_the_same_option_before_it() -> None:
    args = build_parser().parse_args(["--client-id", "a", "history", TICKER, "--client-id", "b"])
    assert settings_from_args(args).client_id == "b"


def test_bad_config_file_exits_2(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("relay_hots: x\n")
    assert main(["history", TICKER, "--config", str(config)]) == ExitCode.USAGE
    assert "relay_hots" in capsys.readouterr().err


def test_rejected_exits_3_with_reason(fake_relay: Any, kit: Any, capsys: Any) -> None:
    fake_relay.handler = lambda m: kit.Action(
        SubmitResponse(request_id=m.request_id, status=Status.REJECTED, reason="range too long")
    )
    assert _run(fake_relay, "history", TICKER, *RANGE) == ExitCode.REJECTED
    assert "range too long" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("no_ingestor", "no ingestor of BINANCE is alive: the last status came 6.1 s ago"),
        ("exchange_unavailable", "exchange BINANCE is failing at every ingestor that serves it"),
    ],
)
def test_routing_refusals_exit_3_at_once_with_reason_and_code(
    fake_relay: Any, kit: Any, capsys: Any, code: str, reason: str
) -> None:
    """The relay's routing refusals end the command on the first answer: no retry, no
    wait for a notification, the reason and the code on stderr."""
    fake_relay.handler = lambda m: kit.Action(
        SubmitResponse(
            request_id=m.request_id, status=Status.REJECTED, reason=reason, error_code=code
        )
    )
    assert _run(fake_relay, "history", TICKER, *RANGE, "--timeout", "60") == ExitCode.REJECTED
    err = capsys.readouterr().err
    assert reason in err and f"[{code}]" in err
    assert len(fake_relay.requests) == 1


def test_error_notification_exits_4(fake_relay: Any, kit: Any, capsys: Any) -> None:
    fake_relay.handler = kit.accept_and_notify(status=Status.ERROR, reason="exchange down")
    assert _run(fake_relay, "history", TICKER, *RANGE) == ExitCode.FAILED
    assert "exchange down" in capsys.readouterr().err


@pytest.mark.parametrize(("missing", "code"), [(0, ExitCode.OK), (50, ExitCode.INCOMPLETE)])
def test_verify_exits_11_when_an_ok_answer_has_missing_candles(
    fake_relay: Any, kit: Any, fake_reader: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any,
    missing: int, code: int,
) -> None:  # fmt: skip
    """OK is not complete: a page the exchange answered empty leaves candles missing."""
    from mdclient.client import Client

    base = kit.accept_and_notify(row_count=1)  # the fake reader holds one candle

    def with_report(message: Any) -> Any:
        action = base(message)
        for _topic, note in action.publish:
            note.expected_candles, note.exchange_gaps = 60, 59 - missing
            note.missing_candles, note.source = missing, HistorySource.SOURCE_EXCHANGE
        return action

    fake_relay.handler = with_report
    monkeypatch.setattr(history, "open_client", lambda s: Client(settings=s, reader=fake_reader))
    assert _run(fake_relay, "history", TICKER, *RANGE, "--verify", "--no-table") == code
    err = " ".join(capsys.readouterr().err.split())
    assert "OK: 1 rows" in err and f"{59 - missing} without trades at the exchange" in err
    if missing:
        assert "incomplete: 50 candles missing" in err


def test_timeout_exits_5_after_all_attempts(fake_relay: Any, kit: Any, capsys: Any) -> None:
    good = kit.accept_and_notify()

    def silent(message: Any) -> Any:
        action = good(message)
        action.publish = []
        return action

    fake_relay.handler = silent
    code = _run(fake_relay, "history", TICKER, *RANGE, "--timeout", "0.2", "--attempts", "2")
    assert code == ExitCode.TIMEOUT
    assert len(fake_relay.requests) == 2
    assert "HistoryTimeout" in capsys.readouterr().err


def test_not_found_exits_6_and_still_writes_an_empty_csv(
    fake_relay: Any, kit: Any, tmp_path: Path
) -> None:
    fake_relay.handler = kit.accept_and_notify(status=Status.NOT_FOUND, row_count=0)
    csv = tmp_path / "empty.csv"
    assert _run(fake_relay, "history", TICKER, *RANGE, "--csv", str(csv)) == ExitCode.NOT_FOUND
    assert csv.read_text().startswith("ticker,period_seconds,open_time,open_time_ms,")
    assert len(csv.read_text().splitlines()) == 1


def test_unreachable_relay_exits_7(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MDCLIENT_CONNECT_TIMEOUT_S", "0.3")
    code = main(
        ["history", TICKER, *RANGE, "--request-endpoint", "tcp://127.0.0.1:9",
         "--market-data-endpoint", "tcp://127.0.0.1:9"]
    )  # fmt: skip
    assert code == ExitCode.UNAVAILABLE


def test_legacy_writes_table_csv_parquet_and_chart(
    fake_relay: Any, kit: Any, tmp_path: Path, capsys: Any
) -> None:
    import pyarrow.parquet as pq

    fake_relay.handler = kit.legacy_ok
    out = [str(tmp_path / n) for n in ("l.csv", "l.parquet", "l.png")]
    code = _run(
        fake_relay, "legacy", TICKER, *RANGE, "--limit", "3",
        "--csv", out[0], "--parquet", out[1], "--chart", out[2],
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == ExitCode.OK, captured.err
    assert "2026-11-20 00:02:00" in captured.out and "102.0000" in captured.out
    assert "OK: 3 rows" in captured.err
    assert len(Path(out[0]).read_text().splitlines()) == 4
    assert pq.read_table(out[1]).num_rows == 3
    assert Path(out[2]).read_bytes()[:4] == b"\x89PNG"


def test_live_streams_until_count(fake_relay: Any, kit: Any, capsys: Any) -> None:
    ohlc_topic = topics.ohlc_topic(TICKER, 60)
    tick_topic = topics.tick_topic(TICKER)
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(
            _run(fake_relay, "live", TICKER, "--ticks", "--ohlc", "1m", "--count", "2")
        )
    )
    thread.start()
    fake_relay.wait_for(lambda ev: ("sub", ohlc_topic) in ev and ("sub", tick_topic) in ev)
    fake_relay.publish(tick_topic, Tick(ticker=TICKER, trade_id="77", price=101.5, amount=0.25))
    fake_relay.publish(ohlc_topic, OHLC(ticker=TICKER, period_seconds=60, open=1, close=2))
    thread.join(10)
    assert codes == [ExitCode.OK]
    lines = capsys.readouterr().out.splitlines()
    assert "tick" in lines[0] and "101.5 x 0.25" in lines[0] and "#77" in lines[0]
    assert "ohlc: 1m" in lines[1]


def test_live_prints_a_sequence_gap_to_stderr_and_drops_a_duplicate(
    fake_relay: Any, capsys: Any
) -> None:
    tick_topic = topics.tick_topic(TICKER)
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(_run(fake_relay, "live", TICKER, "--count", "2"))
    )
    thread.start()
    fake_relay.wait_for(lambda ev: ("sub", tick_topic) in ev)
    for seq in (1, 1, 4):  # a duplicate, then two ticks lost
        tick = Tick(ticker=TICKER, trade_id=str(seq), sequence=seq, publisher_epoch=9)
        fake_relay.publish(tick_topic, tick)
    thread.join(10)
    assert codes == [ExitCode.OK]
    captured = capsys.readouterr()
    assert ["#1" in line for line in captured.out.splitlines()] == [True, False]
    assert f"sequence: {tick_topic}: 2 message(s) lost (sequence gap)" in captured.err


def test_live_duration_ends_with_0(fake_relay: Any) -> None:
    assert _run(fake_relay, "live", TICKER, "--duration", "0.3", "-q") == ExitCode.OK


def test_unexpected_exception_exits_1(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    def boom(args: Any, err: Any) -> int:
        raise RuntimeError("bug")

    monkeypatch.setitem(cli.COMMANDS, "history", boom)
    assert main(["history", TICKER]) == ExitCode.INTERNAL
    assert "RuntimeError: bug" in capsys.readouterr().err


def _signals_as_from_a_shell() -> None:
    """The child's SIGINT as an interactive shell leaves it: default and unblocked. A
    test worker may hold it ignored or blocked, and a child inherits both (Python then
    installs no KeyboardInterrupt handler): reproduced, that hung this test in xdist."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_exits_130_in_a_real_process(fake_relay: Any) -> None:
    """SIGINT while `mdclient live` streams: exit code 130, sockets closed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("CONFIG_PATH", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mdclient", "live", TICKER, *_relay_args(fake_relay)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=_signals_as_from_a_shell,
    )
    try:
        fake_relay.wait_for(lambda ev: ("sub", topics.tick_topic(TICKER)) in ev, timeout=20)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == ExitCode.INTERRUPTED  # a bound on a hang; ~1 s
        # Closed cleanly: the relay saw the unsubscribe or the disconnect, no traceback.
        assert b"Traceback" not in proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_legacy_relay_timeout_status_exits_5(fake_relay: Any, kit: Any) -> None:
    fake_relay.handler = lambda m: kit.Action(
        Response(request_id=m.request_id, status=Status.TIMEOUT, reason="no ingestor answered")
    )
    assert _run(fake_relay, "legacy", TICKER, *RANGE) == ExitCode.TIMEOUT


@pytest.mark.parametrize(
    ("state", "code", "exit_code"),
    [
        (FeedStatus.FAILED, "bad_symbol", ExitCode.FAILED),
        (FeedStatus.REFUSED, "unsupported_period", ExitCode.REJECTED),
    ],
)
def test_live_prints_statuses_to_stderr_and_exits_on_failed_or_refused(
    fake_relay: Any, capsys: Any, state: int, code: str, exit_code: int
) -> None:
    status_topic = topics.status_topic(TICKER)
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(_run(fake_relay, "live", TICKER, "--ohlc", "15m"))
    )
    thread.start()
    fake_relay.wait_for(lambda ev: ("sub", topics.ohlc_topic(TICKER, 900)) in ev)
    fake_relay.publish(status_topic, FeedStatus(ticker=TICKER, state=FeedStatus.STARTED))
    fake_relay.publish(
        status_topic,
        FeedStatus(
            ticker=TICKER,
            state=state,
            error_code=code,
            reason="not served",
            period_seconds=900,  # type: ignore[arg-type]
        ),
    )
    thread.join(10)
    assert codes == [exit_code]
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"status: {TICKER} STARTED" in captured.err
    assert code in captured.err and "not served" in captured.err
