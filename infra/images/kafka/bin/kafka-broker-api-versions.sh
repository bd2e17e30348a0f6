#!/bin/bash
KAFKA_HEAP_OPTS="-Xmx128m" exec "$(dirname "$0")/kafka-run-class.sh" org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
