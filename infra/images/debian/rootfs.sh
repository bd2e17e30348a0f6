#!/usr/bin/env bash
# Make the Debian base image of the offline set without any container registry:
# debootstrap a minimal bookworm root file system from the host's own Debian
# mirror (read from its apt sources, or DEBIAN_MIRROR), give it the same apt
# sources, and `docker import` it as the image named by $1.
#
#   infra/images/debian/rootfs.sh mdp-offline/debian:bookworm
set -euo pipefail

image="${1:?usage: rootfs.sh IMAGE_NAME}"
suite="${DEBIAN_SUITE:-bookworm}"

# The first Debian archive URI the host's apt uses (deb822 .sources or sources.list).
host_mirror() {
    local uri
    uri="$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n 1 || true)"
    if [[ -z "$uri" ]]; then
        uri="$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | grep -v security | head -n 1 || true)"
    fi
    printf '%s' "$uri"
}

mirror="${DEBIAN_MIRROR:-$(host_mirror)}"
if [[ -z "$mirror" ]]; then
    echo "rootfs.sh: no Debian mirror in the host's apt sources; set DEBIAN_MIRROR" >&2
    exit 2
fi
command -v debootstrap >/dev/null || {
    echo "rootfs.sh: debootstrap is not installed (apt-get install debootstrap)" >&2
    exit 2
}

rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >/dev/null
# apt inside the image uses the same mirror(s) as the host: the whole main
# archive, updates and security, exactly as the host is set up.
rm -f "$rootfs/etc/apt/sources.list"
if compgen -G '/etc/apt/sources.list.d/*.sources' >/dev/null; then
    for f in /etc/apt/sources.list.d/*.sources; do
        if grep -q '^URIs: .*debian' "$f"; then
            cp "$f" "$rootfs/etc/apt/sources.list.d/"
        fi
    done
else
    grep -s '^deb .*debian' /etc/apt/sources.list > "$rootfs/etc/apt/sources.list" || true
fi
# Small images: no apt lists, caches, docs or man pages are kept.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/usr/share/doc/* \
    "$rootfs"/usr/share/man/*
tar -C "$rootfs" -c . | docker import \
    --change 'CMD ["bash"]' \
    --change 'ENV LANG=C.UTF-8' \
    --message "debootstrap --variant=minbase $suite" - "$image" >/dev/null
echo "$image"
