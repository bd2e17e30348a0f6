#!/usr/bin/env bash
# Submit the Spark pipeline to the standalone cluster, in client deploy mode:
# the driver, and with it the ZeroMQ PUB the relay connects to, runs in this
# container; executors run on the workers. The --jars/--conf come from the
# pipeline itself (`spark-pipeline submit-args`), read from the same CONFIG_PATH
# the driver reads, so the command line and the config cannot disagree.
set -euo pipefail

master="${SPARK_MASTER_URL:?set SPARK_MASTER_URL, e.g. spark://spark-master:7077}"
# The HEALTHCHECK reads the ready file the pipeline writes once every query runs;
# one left over from before a container restart would report ready too early.
if [[ -n "${PIPELINE_READY_FILE:-}" ]]; then
    rm -f -- "${PIPELINE_READY_FILE}"
fi
app="$(python -c 'import pathlib, pipeline; print(pathlib.Path(pipeline.__file__).with_name("__main__.py"))')"
submit_args="$(spark-pipeline submit-args)"
eval "set -- ${submit_args}"

# Only master and app are logged: the arguments carry the S3 secret key.
echo "submit-pipeline: spark-submit --master ${master} --deploy-mode client ... ${app} run" >&2
# spark-submit (a JVM) runs the Python driver as its child. On SIGTERM/SIGINT
# (docker stop, compose down) only the Python driver is signalled: its handler
# stops the streaming queries and the SparkContext, then the JVM exits on its
# own. Signalling the JVM as well would stop the SparkContext under the queries.
# PID 1 is the container's init (compose `init: true`), which reaps and forwards.
# The trap is set before the launch; a signal that arrives before the pid is
# known is remembered and forwarded as soon as it is.
submit_pid=""
signals=0
forward() {
    signals=$((signals + 1))
    if [[ -n "${submit_pid}" ]]; then
        pkill -TERM -P "${submit_pid}" 2>/dev/null || kill -TERM "${submit_pid}" 2>/dev/null || true
    fi
}
trap forward TERM INT
"${SPARK_HOME}/bin/spark-submit" --master "${master}" --deploy-mode client "$@" "${app}" run &
submit_pid=$!
if ((signals > 0)); then
    forward
fi

# A `wait` cut short by the trap returns >128 before spark-submit has exited (its
# status is still to come): wait again. Exit with spark-submit's own status.
while :; do
    seen=${signals}
    status=0
    wait "${submit_pid}" || status=$?
    if ((status > 128 && signals != seen)); then
        continue
    fi
    exit "${status}"
done
