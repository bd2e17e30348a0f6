"""Complex-event triggers: the pure evaluation engine and its Spark wiring.

Pure modules (no Spark, no sockets, no clock: times are passed in):

- `model`: trigger specs parsed from `CEPTriggerRequest`, notices -> `CEPTriggerEvent`;
- `windows`: rolling volume and rolling min/max over an event-time window;
- `thresholds`: sorted thresholds, so a tick touches only the triggers it crosses;
- `candles`: closed candles of one period built from ticks;
- `engine`: condition edges, sequences, one-shot/repeating, expiry, dedupe;
- `records`: Kafka rows (ticks and trigger records) -> ordered engine inputs.

Edges: `state` (engine snapshots in the query's checkpoint directory),
`kafka` (the compacted trigger topic, tombstones for finished triggers) and
`query` (the streaming query and its foreachBatch runner). docs/cep.md has
the design and the measurements.
"""
