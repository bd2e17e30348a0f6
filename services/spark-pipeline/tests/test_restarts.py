"""Restart decisions for failed queries (pure, a driven clock) and the cause a log line shows."""

from __future__ import annotations

import pytest

from pipeline.config import RestartConfig
from pipeline.restarts import Restarts, failure_cause

POLICY = RestartConfig(max_restarts=3, window_s=100.0, backoff_initial_s=1.0, backoff_max_s=3.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_backoff_doubles_up_to_the_cap_then_gives_up_within_the_window(clock: Clock) -> None:
    restarts = Restarts(POLICY, clock)
    delays = []
    for _ in range(3):
        delays.append(restarts.failed("history"))
        clock.now += 10
    assert delays == [1.0, 2.0, 3.0]  # 4.0 capped at backoff_max_s
    assert restarts.failed("history") is None  # the 4th failure within 100 s
    assert restarts.recent("history") == 4
    assert not restarts.pending("history")


def test_failures_older_than_the_window_are_forgotten(clock: Clock) -> None:
    restarts = Restarts(POLICY, clock)
    for _ in range(3):
        assert restarts.failed("ticks-persist") is not None
        clock.now += 40
    # 120 s after the first failure: two failures left in the window, so this is the 3rd.
    assert restarts.failed("ticks-persist") == 3.0
    clock.now += 101
    assert restarts.failed("ticks-persist") == 1.0  # a quiet window: back to the start


def test_queries_are_counted_apart(clock: Clock) -> None:
    restarts = Restarts(POLICY, clock)
    for _ in range(3):
        restarts.failed("history")
    assert restarts.failed("markets") == 1.0
    assert restarts.failed("history") is None


def test_a_restart_is_due_once_its_delay_passed(clock: Clock) -> None:
    restarts = Restarts(POLICY, clock)
    assert restarts.next_in(5.0) == 5.0  # nothing scheduled: the caller's poll interval
    restarts.failed("history")
    assert restarts.pending("history")
    assert restarts.next_in(5.0) == 1.0
    clock.now += 0.5
    assert restarts.due() == []
    assert restarts.next_in(5.0) == 0.5
    clock.now += 0.5
    assert restarts.due() == ["history"]
    assert not restarts.pending("history")
    assert restarts.due() == []  # handed out once


def test_no_restarts_allowed_gives_up_at_once(clock: Clock) -> None:
    restarts = Restarts(RestartConfig(max_restarts=0), clock)
    assert restarts.failed("cep") is None


# What Spark's StreamingQueryException says (pyspark 4.0.4), abridged: the message of
# a query whose foreachBatch raised, then the query description Spark appends.
PROXY = """An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/venv/lib/python3.11/site-packages/pyspark/sql/utils.py", line 162, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
"""  # noqa: E501
QUERY = """
=== Streaming Query ===
Identifier: history [id = a272c7bc, runId = de305485]
Current Committed Offsets: {}
"""

PYTHON_ERROR = (
    PROXY
    + """  File "/src/pipeline/faults.py", line 74, in __call__
    raise InjectedFailureError(f"injected failure at {name} ({FAIL_ENV}), after the commit")
pipeline.faults.InjectedFailureError: injected failure at history-after-ohlc-commit
second line
"""
    + QUERY
)

JAVA_ERROR_IN_SPARK_CALL = (
    PROXY
    + """  File "/src/pipeline/lake.py", line 530, in _run
    session.sql(statement)
  File "/venv/lib/python3.11/site-packages/py4j/protocol.py", line 327, in get_return_value
    raise Py4JJavaError(
py4j.protocol.Py4JJavaError: An error occurred while calling o312.sql.
: org.apache.iceberg.exceptions.CommitStateUnknownException: Service failed: 500: Server Error
Cannot determine whether the commit was successful or not, the underlying data files may or
\tat org.apache.iceberg.rest.ErrorHandlers$CommitErrorHandler.accept(ErrorHandlers.java:105)
Caused by: org.apache.iceberg.exceptions.ServiceFailureException: Service failed: 500
\t... 40 more
"""
    + QUERY
)

APPEND_ABORTED = (
    PROXY
    + """  File "/venv/lib/python3.11/site-packages/py4j/protocol.py", line 327, in get_return_value
    raise Py4JJavaError(
py4j.protocol.Py4JJavaError: An error occurred while calling o98.append.
: org.apache.spark.SparkException: [WRITING_JOB_ABORTED] Writing job aborted. SQLSTATE: 40000
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.writingJobAbortedError(Errors.scala:1)
Caused by: org.apache.iceberg.exceptions.CommitStateUnknownException: Service failed: 503
Cannot determine whether the commit was successful or not, the underlying data files may or
"""
    + QUERY
)

STAGE_FAILURE = "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0\n"

CONVERTED_JAVA_ERROR = (
    PROXY
    + """  File "/venv/lib/python3.11/site-packages/pyspark/errors/exceptions/captured.py", line 288
    raise converted from None
pyspark.errors.exceptions.captured.SparkRuntimeException: [USER_RAISED_EXCEPTION] boom SQLSTATE: X
"""
    + QUERY
)

JAVA_ONLY = (
    """org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired
\tat org.apache.kafka.clients.consumer.internals.AsyncKafkaConsumer.position(Unknown Source)
Caused by: java.net.ConnectException: Connection refused
"""
    + QUERY
)


class OpaqueError(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        (PYTHON_ERROR, "InjectedFailureError: injected failure at history-after-ohlc-commit"),
        (
            JAVA_ERROR_IN_SPARK_CALL,
            "CommitStateUnknownException: Service failed: 500: Server Error",
        ),
        (CONVERTED_JAVA_ERROR, "SparkRuntimeException: [USER_RAISED_EXCEPTION] boom SQLSTATE: X"),
        (APPEND_ABORTED, "CommitStateUnknownException: Service failed: 503"),
        (STAGE_FAILURE, "SparkException: Job aborted due to stage failure: Task 0"),
        (JAVA_ONLY, "TimeoutException: Timeout of 60000ms expired"),
        ("\nno exception named here\nat all", "OpaqueError: no exception named here"),
    ],
)
def test_failure_cause_is_the_class_and_first_line_of_what_the_batch_raised(
    text: str, cause: str
) -> None:
    assert failure_cause(OpaqueError(text)) == cause


def test_failure_cause_of_a_query_stopped_without_an_error_and_of_a_long_message() -> None:
    assert failure_cause(None) == "stopped without an error"
    cause = failure_cause(ValueError("x" * 1000))
    assert len(cause) == 300 and cause.startswith("ValueError: xxx") and cause.endswith("...")
