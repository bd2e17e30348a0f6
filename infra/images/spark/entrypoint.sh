#!/bin/bash
# Pass-through entry point, as the upstream image's for a non-Kubernetes command:
# run what the container was given (spark-class, spark-submit, a script).
set -e
exec "$@"
