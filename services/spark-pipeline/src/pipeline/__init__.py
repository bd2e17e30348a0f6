"""Spark pipeline: Kafka -> Iceberg + ZeroMQ PUB (the protocol's "Flink"). See README.md."""
