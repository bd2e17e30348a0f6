"""Unit tests of process supervision, port checks, errors, S3 signing and the artifact cache.

None of these start the real stack; the few subprocesses are tiny Pythons.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import artifacts
from infra.localstack import LocalStack, PortInUseError, Ports, StackConfig
from infra.localstack.__main__ import main as localstack_cli
from infra.localstack.process import (
    ExitWatcher,
    PidFile,
    ProcessRecord,
    check_ports_free,
    port_is_free,
    spawn,
    start_failure,
    terminate,
    wait_ports_free,
)
from infra.localstack.s3 import sigv4_headers
from infra.versions import load_versions


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A socket listening on a free loopback port, as another program would."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s


def test_port_taken_is_detected(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    assert not port_is_free(port, "127.0.0.1")
    assert not port_is_free(port, "0.0.0.0")
    with pytest.raises(PortInUseError, match=rf"kafka: port {port} \(kafka\) on 127.0.0.1"):
        check_ports_free("kafka", {"kafka": port}, ("127.0.0.1",))


def test_a_restart_waits_for_a_dead_process_s_port_and_not_for_ever(
    listener: socket.socket,
) -> None:
    """The port is released on the third look (the killed process's last thread gone);
    one never released is refused once the time is up."""
    port = listener.getsockname()[1]
    looks = 0

    def clock() -> float:
        nonlocal looks
        looks += 1
        if looks == 3:
            listener.close()
        return float(looks)

    wait_ports_free("ingestor", {"ingestor_metrics": port}, ("127.0.0.1",), 10.0, clock)
    assert looks == 3  # held at the first look in the loop, free after the second

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        ticks = iter(range(100))
        with pytest.raises(PortInUseError, match=f"ingestor: port {taken}"):
            wait_ports_free(
                "ingestor", {"ingestor_metrics": taken}, ("127.0.0.1",), 3.0,
                lambda: float(next(ticks)),
            )  # fmt: skip


def test_up_refuses_a_taken_port_before_starting_anything(
    listener: socket.socket, tmp_path: Path
) -> None:
    ports = Ports.free().model_copy(update={"catalog": listener.getsockname()[1]})
    stack = LocalStack(StackConfig(data_dir=tmp_path, ports=ports), log=lambda _: None)
    with pytest.raises(PortInUseError) as info:
        stack.up()
    assert "iceberg-rest" in str(info.value)
    assert "INFRA_STACK_PORTS__CATALOG" in str(info.value)
    assert all(s.state == "stopped" for s in stack.status())
    assert not list((tmp_path / "run").glob("*.pid"))


def test_start_failure_names_component_and_shows_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "kafka.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)) + "BindException: boom\n")
    err = start_failure("kafka", log, "process exited (code 1)")
    text = str(err)
    assert text.startswith("kafka failed to start: process exited (code 1)")
    assert str(log) in text
    assert "BindException: boom" in text
    assert "line 10\n" not in text  # only the tail


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _sigterm_ignored(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(
        next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16
    )
    return bool(mask & (1 << (15 - 1)))


def _spawn(tmp_path: Path, code: str) -> tuple[ProcessRecord, PidFile]:
    pid_file = PidFile(tmp_path / "run" / "x.pid")
    _proc, record = spawn(
        "x",
        _python(code),
        env=dict(os.environ),
        cwd=tmp_path,
        log_file=tmp_path / "x.log",
        ports={},
        pid_file=pid_file,
    )
    return record, pid_file


def test_terminate_stops_with_sigterm(tmp_path: Path) -> None:
    record, pid_file = _spawn(tmp_path, "import time; time.sleep(600)")
    assert pid_file.read() == record
    assert record.alive
    assert terminate(record, timeout_s=10) == "stopped"
    assert not record.alive
    assert terminate(record, timeout_s=1) == "not running"


def test_terminate_escalates_to_sigkill(tmp_path: Path) -> None:
    code = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.pause()"
    record, _ = _spawn(tmp_path, code)
    deadline = time.monotonic() + 10
    watcher = ExitWatcher(record.pid)
    try:
        while not _sigterm_ignored(record.pid):  # poll until the handler is installed
            assert time.monotonic() < deadline
            assert not watcher.wait(0.05), "child exited early"
    finally:
        watcher.close()
    assert terminate(record, timeout_s=0.5) == "killed"
    assert not record.alive


def test_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    record = ProcessRecord("x", os.getpid(), start_ticks=1, ports={}, log_file="", argv=[])
    assert not record.alive  # same pid, different start time


def test_status_and_down_on_an_empty_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert localstack_cli(["status", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("stopped") == 4
    assert localstack_cli(["status", "--check", "--data-dir", str(tmp_path)]) == 3
    assert localstack_cli(["down", "--data-dir", str(tmp_path)]) == 0


def test_sigv4_matches_aws_documented_example() -> None:
    # "GET Bucket (List Objects)" example of the AWS Signature V4 documentation.
    headers = sigv4_headers(
        method="GET",
        host="examplebucket.s3.amazonaws.com",
        path="/",
        query={"max-keys": "2", "prefix": "J"},
        access_key="AKIAIOSFODNN7EXAMPLE",
        secret_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        region="us-east-1",
        now=dt.datetime(2013, 5, 24, tzinfo=dt.UTC),
    )
    assert headers["authorization"].endswith(
        "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"
    )


def test_versions_come_from_the_pom_and_match_pyspark() -> None:
    import pyspark

    v = load_versions()
    assert v.spark == pyspark.__version__
    assert v.iceberg_spark_major == ".".join(v.spark.split(".")[:2])
    assert v.coordinates["iceberg-rest"] == [
        f"org.apache.iceberg:iceberg-open-api:{v.iceberg}",
        f"org.postgresql:postgresql:{v.postgresql_jdbc}",
    ]


def test_marker_must_match_the_pom_fingerprint(tmp_path: Path) -> None:
    comp = tmp_path / "spark"
    comp.mkdir()
    (comp / "a.jar").write_bytes(b"jar")
    fp = artifacts.fingerprint()
    resolved = artifacts._write_marker(comp, fp)
    assert resolved.jars == (comp / "a.jar",)
    assert artifacts._read_marker(comp, fp) == resolved
    assert artifacts._read_marker(comp, "other-fingerprint") is None
    (comp / "a.jar").unlink()
    assert artifacts._read_marker(comp, fp) is None  # a deleted jar forces re-resolution


def test_resolved_cache_needs_no_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fp = artifacts.fingerprint()
    for name in artifacts.COMPONENTS:
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.jar").write_bytes(b"jar")
        artifacts._write_marker(tmp_path / name, fp)

    def no_maven(*args: object, **kwargs: object) -> None:
        raise AssertionError("Maven must not run for a resolved cache")

    monkeypatch.setattr(artifacts, "_run_maven", no_maven)
    monkeypatch.setenv(artifacts.CACHE_ENV, str(tmp_path))
    assert artifacts.spark_jars() == [tmp_path / "spark" / "spark.jar"]
    assert artifacts.kafka_classpath() == [tmp_path / "kafka" / "kafka.jar"]
    marker = json.loads((tmp_path / "spark" / artifacts.MARKER).read_text())
    assert marker["coordinates"] == load_versions().coordinates["spark"]
