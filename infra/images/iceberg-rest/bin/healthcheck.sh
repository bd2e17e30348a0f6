#!/bin/bash
# Exit 0 when the catalog answers GET PATH (default /v1/namespaces) with HTTP 200 on
# 127.0.0.1:$CATALOG_REST_PORT. Listing namespaces is a query of the JdbcCatalog's
# database, so a catalog that lost PostgreSQL fails it; /v1/config would not.
# Plain bash (/dev/tcp): not every JRE base image has curl.
set -euo pipefail
path=${1:-/v1/namespaces}
port=${CATALOG_REST_PORT:-8181}
exec 3<>"/dev/tcp/127.0.0.1/${port}"
printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$path" >&3
status=""
read -r -t 4 status <&3 || true
case "$status" in
    "HTTP/1."?" 200 "*) exit 0 ;;
esac
echo "GET $path on port $port answered: ${status:-nothing}" >&2
exit 1
