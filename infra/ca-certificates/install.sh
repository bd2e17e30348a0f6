#!/bin/sh
# Trust the extra CA certificates next to this script in a builder stage:
# the system bundle (pip, curl, Go) and, where a JDK is present, the JVM's
# default trust store (Maven). A no-op when the folder holds no *.crt.
set -eu
here="$(dirname "$0")"
set -- "$here"/*.crt
[ -e "$1" ] || exit 0
mkdir -p /usr/local/share/ca-certificates/mdp-extra
cp "$@" /usr/local/share/ca-certificates/mdp-extra/
update-ca-certificates >/dev/null 2>&1
if command -v keytool >/dev/null 2>&1; then
    for crt in "$@"; do
        keytool -importcert -noprompt -cacerts -storepass changeit \
            -alias "mdp-extra-$(basename "$crt" .crt)" -file "$crt" >/dev/null 2>&1 || true
    done
fi
