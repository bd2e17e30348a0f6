#!/usr/bin/env bash
# Make sure headless Chromium and its WebDriver are installed for the gateway's browser
# test (e2e/test_gateway_browser.py): Debian's chromium and chromium-driver, from the
# Debian mirror (no browser download from anywhere else). Exit 0 when both are on PATH.
#
#   infra/ci/chromium.sh
set -euo pipefail

say() { echo "chromium: $*" >&2; }

installed() { command -v chromium >/dev/null && command -v chromedriver >/dev/null; }

installed && exit 0
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    say "not installed, and this is not a root Debian machine: install chromium and chromium-driver"
    exit 1
fi
say "installing Debian's chromium and chromium-driver"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver >/dev/null
installed || { say "installed, but chromium or chromedriver is still not on PATH"; exit 1; }
