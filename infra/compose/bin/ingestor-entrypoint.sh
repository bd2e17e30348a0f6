#!/bin/sh
# Ingestor container entry point: pick the config, then become the ingestor.
#
# An explicit CONFIG_PATH always wins. Otherwise the compose profile decides:
# `--profile offline` adds the exchange simulator to the network as
# `exchange-sim`, and when that name resolves the ingestor reads
# config.offline.yaml (Binance URLs pointed at the simulator); without the
# profile it reads config.yaml and talks to the real exchange.
set -eu

conf_dir="${MDP_CONFIG_DIR:-/etc/mdp/ingestor}"
sim_host="${MDP_EXCHANGE_SIM_HOST:-exchange-sim}"

if [ -z "${CONFIG_PATH:-}" ]; then
    if [ -f "$conf_dir/config.offline.yaml" ] && getent hosts "$sim_host" >/dev/null 2>&1; then
        CONFIG_PATH="$conf_dir/config.offline.yaml"
        echo "ingestor-entrypoint: offline profile ($sim_host resolves): $CONFIG_PATH" >&2
        # The simulator takes any API key; Binance's historicalTrades (the gap
        # repairer's id cursor) needs one.
        export INGESTOR_BINANCE_API_KEY="${INGESTOR_BINANCE_API_KEY:-simulator}"
    else
        CONFIG_PATH="$conf_dir/config.yaml"
    fi
    export CONFIG_PATH
fi
echo "ingestor-entrypoint: CONFIG_PATH=$CONFIG_PATH" >&2
exec ingestor "$@"
