#!/usr/bin/env bash
# Make sure headless Chromium and its WebDriver are installed for the gateway's browser
# test (e2e/test_gateway_browser.py): Debian's chromium and chromium-driver, from the
# Debian mirror (no browser download from anywhere else). Exit 0 when both are on PATH.
#
#   infra/ci/chromium.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"

say() { echo "chromium: $*" >&2; }

installed() { command -v chromium >/dev/null && command -v chromedriver >/dev/null; }

installed && exit 0
apt_install_or_explain "chromium and chromium-driver" chromium chromium-driver
installed || { say "installed, but chromium or chromedriver is still not on PATH"; exit 1; }
