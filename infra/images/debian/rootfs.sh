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
# Small images, now and after every later `apt-get install` in the images built
# on this one: dpkg skips docs, man pages and translations, and apt keeps neither
# the downloaded .deb files nor its package caches (~120 MB per install layer).
cat > "$rootfs/etc/dpkg/dpkg.cfg.d/mdp-slim" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
CFG
cat > "$rootfs/etc/apt/apt.conf.d/mdp-slim" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
CFG
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* "$rootfs"/usr/share/info/*
find "$rootfs"/usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete
tar -C "$rootfs" -c . | docker import \
    --change 'CMD ["bash"]' \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL mdp.rootfs=${MDP_ROOTFS_LABEL:-manual}" \
    --message "debootstrap --variant=minbase $suite" - "$image" >/dev/null
echo "$image"
