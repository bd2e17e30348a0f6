"""Spark pipeline: Kafka -> Iceberg + ZeroMQ PUB (the spec's Flink). See README.md."""
