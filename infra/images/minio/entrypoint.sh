#!/bin/sh
# As the upstream image: arguments that are not a command are minio's
# (`server /data` runs `minio server /data`).
set -e
if [ "${1}" != "minio" ] && [ -n "${1}" ] && ! command -v "${1}" >/dev/null 2>&1; then
    set -- minio "$@"
fi
exec "$@"
