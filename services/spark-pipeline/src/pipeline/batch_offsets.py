"""How many Kafka records a micro-batch holds, read from its query's offset log.

Why: `write_paths.WriteRule.decode_on` picks where a batch is decoded by its size,
and the size must be known before a record is fetched (fetching it to the driver
is what the executors' path avoids). Spark writes each batch's end offsets to
``<checkpoint>/offsets/<batch id>`` before it runs the batch (its write-ahead log);
the batch starts where the one before ended, or, for the first, at the initial
offsets the Kafka source wrote to ``<checkpoint>/sources/0/0``. The count is an
upper bound: records that retention deleted or transaction markers are counted.

The files are Spark's (``OffsetSeqLog``, ``KafkaSourceInitialOffsetWriter``): a
version line ``v1``, then (offset log) a metadata line and one line per source, the
Kafka source's as ``{"topic": {"partition": offset}}``. Read where the checkpoint
is, a local folder or the S3 store (`blobs.Folder`).
"""

from __future__ import annotations

import json

from pipeline.blobs import Folder

#: (topic, partition) -> offset
Offsets = dict[tuple[str, int], int]


class OffsetLogError(RuntimeError):
    """The offset log does not say where a batch starts and ends."""


def parse_kafka_offsets(text: str) -> Offsets:
    """The offsets of one Kafka source's JSON (``{"topic": {"0": 12, "1": 40}}``)."""
    raw = json.loads(text)
    return {(topic, int(p)): int(o) for topic, parts in raw.items() for p, o in parts.items()}


def parse_offset_log_entry(text: str) -> Offsets:
    """The end offsets in one ``offsets/<batch id>`` file of a query with one Kafka source."""
    lines = text.strip("\x00").splitlines()
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise OffsetLogError(f"not an offset log entry: {text[:200]!r}")
    return parse_kafka_offsets(lines[2])


def parse_initial_offsets(text: str) -> Offsets:
    """The offsets in ``sources/0/0``: a NUL byte (Spark 2.1's format), ``v1``, the JSON."""
    lines = text.lstrip("\x00").splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise OffsetLogError(f"not initial offsets: {text[:200]!r}")
    return parse_kafka_offsets(lines[1])


def records_between(start: Offsets, end: Offsets) -> int:
    """Records from ``start`` up to ``end``; a partition new in ``end`` counts from 0."""
    return sum(max(0, o - start.get(tp, 0)) for tp, o in end.items())


def batch_records(checkpoint: Folder, batch_id: int) -> int:
    """How many records micro-batch ``batch_id`` of the query checkpointed in
    ``checkpoint`` reads (at most: see the module)."""
    offsets = checkpoint.folder("offsets")
    end_text = _text(offsets.child(str(batch_id)).read())
    if end_text is None:
        raise OffsetLogError(
            f"{offsets.child(str(batch_id))} is missing: batch {batch_id} was not planned here"
        )
    end = parse_offset_log_entry(end_text)
    if batch_id == 0:
        initial = _text(checkpoint.folder("sources").folder("0").child("0").read())
        if initial is None:
            raise OffsetLogError(f"{checkpoint.path}: no initial offsets (sources/0/0)")
        start = parse_initial_offsets(initial)
    else:  # Spark keeps the last 100 entries (spark.sql.streaming.minBatchesToRetain)
        before = _text(offsets.child(str(batch_id - 1)).read())
        if before is None:
            raise OffsetLogError(f"{offsets.path}: no entry of batch {batch_id - 1}")
        start = parse_offset_log_entry(before)
    return records_between(start, end)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode(errors="replace")
