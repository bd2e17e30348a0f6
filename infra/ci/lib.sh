# Shared by the infra/ci scripts (sourced, never run): installing from Debian's
# mirror needs root and apt-get; anywhere else, say what to install by hand.
#
#   source "$(dirname "$0")/lib.sh"; apt_install_or_explain "chromium and chromium-driver" chromium chromium-driver

# apt_install_or_explain WHAT PACKAGE...: install PACKAGEs quietly, or exit 1 naming WHAT.
apt_install_or_explain() {
    local what=$1
    shift
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        say "not installed, and this is not a root Debian machine: install ${what}"
        exit 1
    fi
    say "installing Debian's ${what}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
