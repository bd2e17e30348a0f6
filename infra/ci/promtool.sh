#!/usr/bin/env bash
# Make sure Prometheus's promtool runs, for the `promtool check metrics` test
# (e2e/test_service_metrics.py), and print its path: the one on PATH, else the one
# taken from Debian's prometheus package (from the Debian mirror) into
# .cache/promtool/. Only promtool is unpacked: installing the package would also
# start a Prometheus server from its init script. Needs no root where apt's package
# lists are present; as root it refreshes them first (a fresh CI machine).
#
#   infra/ci/promtool.sh
set -euo pipefail
say() { echo "promtool: $*" >&2; }

cache="$(cd "$(dirname "$0")/../.." && pwd)/.cache/promtool"
for candidate in "$(command -v promtool || true)" "${cache}/usr/bin/promtool"; do
    if [[ -n $candidate ]] && "$candidate" --version >/dev/null 2>&1; then
        echo "$candidate"
        exit 0
    fi
done

if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
    say "not installed, and this is not a Debian machine: install Prometheus's promtool"
    exit 1
fi
mkdir -p "$(dirname "$cache")"
work=$(mktemp -d "${cache}.XXXXXX")  # beside it: the final mv is a rename
trap 'rm -rf "$work"' EXIT
[[ $(id -u) -ne 0 ]] || apt-get update -qq
say "taking promtool from Debian's prometheus package"
if ! out=$(cd "$work" && apt-get download -qq prometheus 2>&1); then
    say "apt-get download prometheus failed (apt-get update as root first?): ${out}"
    exit 1
fi
mkdir "$work/root"
dpkg-deb --fsys-tarfile "$work"/prometheus_*.deb | tar -x -C "$work/root" ./usr/bin/promtool
"$work/root/usr/bin/promtool" --version >/dev/null
rm -rf "$cache"
mv -T "$work/root" "$cache"  # whole, or not at all: a concurrent run never sees half a binary
echo "${cache}/usr/bin/promtool"
