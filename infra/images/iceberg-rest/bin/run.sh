#!/bin/sh
# Iceberg's REST catalog server through the platform's launcher
# (infra/catalog/CatalogServer.java; main class org.apache.iceberg.rest.CatalogServer).
# JAVA_OPTS: heap and JVM flags (the image's default mirrors the local stack's).
# shellcheck disable=SC2086  # JAVA_OPTS is a list of options
exec java ${JAVA_OPTS:-} -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -cp '/opt/iceberg-rest/classes:/opt/iceberg-rest/lib/*' \
    org.apache.iceberg.rest.CatalogServer "$@"
