"""Iceberg SQL text: keys, partitioning, pruning bounds, literal safety."""

from __future__ import annotations

import pytest

from pipeline import lake
from pipeline.lake import TableNames

NAMES = TableNames("lake", "market")


def test_table_names() -> None:
    assert NAMES.ohlc == "lake.market.ohlc"
    assert NAMES.requests == "lake.market.requests"
    assert NAMES.ohlc_for_clients == "market.ohlc"


def test_ddl_partitions_for_client_queries() -> None:
    ohlc = lake.create_ohlc(NAMES)
    assert "PARTITIONED BY (ticker, period_seconds, months(open_time))" in ohlc
    assert "open_time TIMESTAMP NOT NULL" in ohlc
    assert "PARTITIONED BY (ticker, days(trade_time))" in lake.create_ticks(NAMES)
    assert "PARTITIONED BY (bucket(16, request_id))" in lake.create_requests(NAMES)
    assert all("IF NOT EXISTS" in statement for statement in lake.ddl(NAMES))


def test_ohlc_ddl_lists_the_record_columns_in_order_and_older_tables_get_the_new_ones() -> None:
    from pipeline.records import OHLC_SCHEMA

    ddl = lake.create_ohlc(NAMES)
    body = ddl[ddl.index("(") + 1 : ddl.index(")\nUSING")]
    assert [line.split()[0] for line in body.splitlines() if line.strip()] == OHLC_SCHEMA.names
    assert lake.add_columns(NAMES.ohlc, lake.OHLC_ADDED_COLUMNS) == (
        "ALTER TABLE lake.market.ohlc ADD COLUMNS"
        " (quote_volume DOUBLE, taker_buy_volume DOUBLE, taker_buy_quote_volume DOUBLE,"
        " incomplete BOOLEAN)"
    )
    # Every added column takes part in the MERGEs' comparisons (incomplete: its own terms).
    assert set(lake.OHLC_ADDED_COLUMNS) <= {*lake.OHLC_VALUE_COLUMNS, "incomplete"}


def test_commit_retries_ride_out_an_outage_on_new_and_existing_tables() -> None:
    props = {k: int(v) for k, v in lake.COMMIT_RETRY_PROPERTIES.items()}
    waits, wait, retries = 0, props["commit.retry.min-wait-ms"], 0
    while waits < 20_000:  # Iceberg: min-wait doubling up to max-wait per retry
        waits += wait
        wait = min(2 * wait, props["commit.retry.max-wait-ms"])
        retries += 1
    assert retries <= props["commit.retry.num-retries"]
    assert props["commit.retry.total-timeout-ms"] >= 20_000
    for statement in lake.ddl(NAMES)[1:]:
        assert "'commit.retry.num-retries' = '20'" in statement
        assert "'commit.retry.total-timeout-ms' = '60000'" in statement
    # A table from before: only what differs is set (each ALTER is a commit).
    old = {"commit.retry.num-retries": "10", "commit.retry.min-wait-ms": "100", "x": "y"}
    lacking = lake.properties_to_set(old, lake.COMMIT_RETRY_PROPERTIES)
    assert lacking == {
        "commit.retry.num-retries": "20",
        "commit.retry.max-wait-ms": "5000",
        "commit.retry.total-timeout-ms": "60000",
    }
    assert lake.properties_to_set(lake.COMMIT_RETRY_PROPERTIES, lake.COMMIT_RETRY_PROPERTIES) == {}
    assert lake.set_properties(NAMES.ticks, {"a.b": "1", "c": "2"}) == (
        "ALTER TABLE lake.market.ticks SET TBLPROPERTIES ('a.b' = '1', 'c' = '2')"
    )


def test_timestamp_literal_is_utc_with_microseconds() -> None:
    assert lake.timestamp_literal(1_700_000_040_123) == (
        "TIMESTAMP '2023-11-14 22:14:00.123000+00:00'"
    )


def test_history_merge_matches_the_natural_key_and_updates_only_changes() -> None:
    sql = lake.merge_history_candles("lake.market.ohlc", "src", 0, 60_000)
    assert "t.ticker = s.ticker AND t.period_seconds = s.period_seconds" in sql
    assert "AND t.open_time = s.open_time" in sql
    assert "t.open_time >= TIMESTAMP '1970-01-01 00:00:00.000000+00:00'" in sql
    assert "WHEN MATCHED AND (NOT (t.open <=> s.open) OR" in sql
    # An exchange candle replaces an incomplete live one even where the values agree.
    assert "OR coalesce(t.incomplete, false)) THEN UPDATE SET *" in sql
    assert "WHEN NOT MATCHED THEN INSERT *" in sql


def test_live_and_tick_merges_only_insert() -> None:
    live = lake.merge_live_candles("lake.market.ohlc", "src", 0, 1)
    ticks = lake.merge_ticks("lake.market.ticks", "src", 0, 1)
    for sql in (live, ticks):
        assert "WHEN MATCHED" not in sql
        assert sql.endswith("WHEN NOT MATCHED THEN INSERT *")
    assert "t.ticker = s.ticker AND t.trade_id = s.trade_id" in ticks


def test_amending_live_merge_updates_only_changed_live_candles() -> None:
    sql = lake.merge_live_candles("lake.market.ohlc", "src", 0, 1, amend=True)
    assert "WHEN MATCHED AND t.source = 'live' AND (NOT (t.open <=> s.open) OR " in sql
    assert "NOT (t.trade_count <=> s.trade_count)" in sql
    assert "NOT (t.incomplete <=> s.incomplete)) AND" in sql
    # A candle of fewer trades than the stored one is an older view: never an amendment.
    assert "AND coalesce(s.trade_count >= t.trade_count, true) THEN UPDATE SET *" in sql
    assert sql.endswith("WHEN NOT MATCHED THEN INSERT *")


def test_values_that_would_break_the_sql_are_refused() -> None:
    with pytest.raises(ValueError, match="not a valid id"):
        lake.select_requests("t", ["x' OR '1'='1"])


def _current(names: TableNames) -> dict[str, lake.TableState | None]:
    return {
        target: lake.TableState(frozenset(schema.names), dict(lake.COMMIT_RETRY_PROPERTIES))
        for target, schema in lake.pipeline_tables(names).items()
    }


def test_a_restart_on_current_tables_runs_no_table_statement() -> None:
    assert lake.setup_statements(NAMES, _current(NAMES)) == []


def test_missing_tables_are_created_and_older_ones_evolved_only_where_they_lag() -> None:
    found = _current(NAMES)
    found[NAMES.ticks] = None
    ohlc_before = frozenset(c for c in lake.Ohlc.SCHEMA.names if c not in lake.OHLC_ADDED_COLUMNS)
    found[NAMES.ohlc] = lake.TableState(ohlc_before, {"commit.retry.num-retries": "4"})
    statements = lake.setup_statements(NAMES, found)
    assert statements[:2] == [lake.create_namespace(NAMES), lake.create_ticks(NAMES)]
    assert statements[2] == lake.add_columns(NAMES.ohlc, lake.OHLC_ADDED_COLUMNS)
    assert statements[3].startswith("ALTER TABLE lake.market.ohlc SET TBLPROPERTIES")
    assert "'commit.retry.num-retries' = '20'" in statements[3]
    assert len(statements) == 4
    everything = lake.setup_statements(NAMES, dict.fromkeys(lake.pipeline_tables(NAMES)))
    assert everything == lake.ddl(NAMES)


def test_a_table_without_a_column_the_pipeline_cannot_add_is_refused() -> None:
    found = _current(NAMES)
    found[NAMES.requests] = lake.TableState(frozenset({"request_id"}), {})
    with pytest.raises(lake.SchemaMismatchError, match=r"lake\.market\.requests exists without"):
        lake.setup_statements(NAMES, found)


def test_a_batchs_time_range_in_ms_holds_every_microsecond_time() -> None:
    """The MERGEs' and the key read's time bounds: floor of the first, ceiling of the last."""
    import pyarrow as pa

    times = pa.chunked_array([[1_000_999, 5_000_001], [3_000_000]], pa.timestamp("us", "UTC"))
    assert lake._time_range_ms(times) == (1_000, 5_001)
