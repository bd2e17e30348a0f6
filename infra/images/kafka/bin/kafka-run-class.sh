#!/bin/bash
# Run a Kafka class on the broker's classpath (what the upstream script does, minus
# its many options): kafka-run-class.sh [JVM options] CLASS [args].
set -euo pipefail
exec "${JAVA_HOME:-/opt/java/openjdk}/bin/java" -Djava.awt.headless=true \
    ${KAFKA_HEAP_OPTS:--Xmx256m} ${KAFKA_OPTS:-} \
    -Dorg.slf4j.simpleLogger.log.org.apache.kafka.common.config.AbstractConfig=warn \
    -cp '/opt/kafka/libs/*' "$@"
