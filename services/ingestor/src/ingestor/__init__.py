"""ccxt ingestor: exchange REST/websocket -> Kafka (OHLCBatch, Tick, Market records).

`ingestor.app.Ingestor` is the service; `python -m ingestor` / the `ingestor`
console script runs it with settings from CONFIG_PATH and INGESTOR_* variables.
"""
