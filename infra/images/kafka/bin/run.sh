#!/bin/bash
# Start a KRaft broker configured like the upstream apache/kafka image:
#   KAFKA_FOO_BAR=x     -> foo.bar=x      (___ -> "-", __ -> "_", _ -> ".")
#   CLUSTER_ID          -> the id the log dirs are formatted with on first start
# KAFKA_HEAP_OPTS / KAFKA_OPTS / KAFKA_JVM_PERFORMANCE_OPTS are JVM options, not
# broker settings.
set -euo pipefail

config=/opt/kafka/config/server.properties
: > "$config"
while IFS='=' read -r name value; do
    case "$name" in
        KAFKA_HEAP_OPTS | KAFKA_OPTS | KAFKA_JVM_PERFORMANCE_OPTS | KAFKA_LOG4J_OPTS | KAFKA_GC_LOG_OPTS | KAFKA_JMX_OPTS | KAFKA_VERSION) continue ;;
        KAFKA_*) ;;
        *) continue ;;
    esac
    key="${name#KAFKA_}"
    key="${key,,}"
    key="${key//___/-}"
    key="${key//__/@}"
    key="${key//_/.}"
    key="${key//@/_}"
    printf '%s=%s\n' "$key" "$value" >> "$config"
done < <(env)

log_dirs="$(sed -n 's/^log\.dirs=//p' "$config")"
log_dirs="${log_dirs:-/tmp/kraft-combined-logs}"
if [[ ! -f "${log_dirs%%,*}/meta.properties" ]]; then
    : "${CLUSTER_ID:?set CLUSTER_ID: the storage is not formatted yet}"
    "$(dirname "$0")/kafka-run-class.sh" kafka.tools.StorageTool format \
        "--cluster-id=${CLUSTER_ID}" --config "$config" --ignore-formatted
fi
exec "${JAVA_HOME}/bin/java" -Djava.awt.headless=true ${KAFKA_HEAP_OPTS:--Xmx1g} ${KAFKA_OPTS:-} \
    -XX:+ExitOnOutOfMemoryError \
    -Dorg.slf4j.simpleLogger.showDateTime=true \
    -Dorg.slf4j.simpleLogger.log.org.apache.kafka.common.config.AbstractConfig=warn \
    -cp '/opt/kafka/libs/*' kafka.Kafka "$config"
