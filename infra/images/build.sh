#!/usr/bin/env bash
# Build the offline image set: an equivalent of every third-party image the
# compose platform uses, from package registries only (Debian, PyPI, Maven
# Central, Go modules), under the project's own names (mdp-offline/*; never an
# upstream name). `make images-offline` runs this; infra/images/compose.yml
# selects the set (docs/docker.md, "Without Docker Hub").
#
#   infra/images/build.sh            build what is missing (layer cache makes reruns cheap)
#   infra/images/build.sh go|bases   only the Go compile | every image but MinIO's and mc's
#   REBUILD=1 infra/images/build.sh  also redo the debootstrap base and the Go binaries
#   MDP_HOST_CA=1 infra/images/build.sh  first copy the host's extra CA certificates
#                                    (a TLS-intercepting proxy's) into infra/ca-certificates/
#
# Needs: docker, debootstrap (root), Go >= 1.24 (MinIO and mc are built on the host
# from their Go modules and copied into their images).
set -euo pipefail
cd "$(dirname "$0")/../.."

# Pinned versions: the compose file's upstream tags and these must move together
# (infra/tests/test_compose.py checks Kafka and Spark against infra/versions.py, and
# PostgreSQL's major version against docker-compose.yml's catalog-db).
MINIO_MODULE_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
MC_MODULE_VERSION=v0.0.0-20250313080218-cf909e1063a9
SPARK_VERSION="$(sed -n 's:.*<spark.version>\(.*\)</spark.version>.*:\1:p' infra/maven/pom.xml)"
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' infra/maven/pom.xml)"

DEBIAN=mdp-offline/debian:bookworm
PYTHON=mdp-offline/python:3.11
JRE=mdp-offline/jre:17
MAVEN=mdp-offline/maven:3-jdk17
SPARK=mdp-offline/spark:${SPARK_VERSION}
KAFKA=mdp-offline/kafka:${KAFKA_VERSION}
MINIO=mdp-offline/minio:${MINIO_MODULE_VERSION}
MC=mdp-offline/mc:${MC_MODULE_VERSION}
# Debian bookworm's prometheus package; docker-compose.yml pins the same upstream release.
PROMETHEUS=mdp-offline/prometheus:2.42.0
# Debian bookworm's PostgreSQL (the catalog's database); docker-compose.yml pins an
# upstream postgres:<same major>.x-bookworm.
POSTGRES=mdp-offline/postgres:15

phase() {
    local name=$1 start=$SECONDS
    shift
    printf '[images] %-28s ...\n' "$name"
    "$@"
    printf '[images] %-28s %4ds\n' "$name" $((SECONDS - start))
}

have_image() { [[ -z "${REBUILD:-}" ]] && docker image inspect "$1" >/dev/null 2>&1; }

# The base is redone when rootfs.sh changed (its checksum is the image's mdp.rootfs label).
debian_base() {
    local want
    want="$(sha256sum infra/images/debian/rootfs.sh | cut -c1-16)"
    if have_image "$DEBIAN" \
        && [[ "$(docker image inspect -f '{{index .Config.Labels "mdp.rootfs"}}' "$DEBIAN")" == "$want" ]]; then
        return
    fi
    MDP_ROOTFS_LABEL="$want" infra/images/debian/rootfs.sh "$DEBIAN"
}

# docker build -f infra/images/<dir>/Dockerfile -t <image> [--build-arg K=V ...] .
build() {
    local dir=$1 image=$2
    shift 2
    docker build --quiet -f "infra/images/$dir/Dockerfile" -t "$image" \
        --build-arg "DEBIAN_IMAGE=$DEBIAN" --build-arg "PYTHON_IMAGE=$PYTHON" \
        --build-arg "JRE_IMAGE=$JRE" --build-arg "MAVEN_IMAGE=$MAVEN" "$@" . >/dev/null
}

go_binaries() {
    local bin=infra/images/minio/bin stamp="$MINIO_MODULE_VERSION $MC_MODULE_VERSION"
    if [[ -z "${REBUILD:-}" && -x $bin/minio && -x $bin/mc && "$(cat $bin/.versions 2>/dev/null)" == "$stamp" ]]; then
        return
    fi
    command -v go >/dev/null || { echo "build.sh: Go >= 1.24 is needed to build MinIO and mc" >&2; exit 2; }
    mkdir -p "$bin"
    local gobin
    gobin="$(cd "$bin" && pwd)"
    CGO_ENABLED=0 GOBIN="$gobin" go install -trimpath -ldflags "-s -w" "github.com/minio/minio@$MINIO_MODULE_VERSION"
    CGO_ENABLED=0 GOBIN="$gobin" go install -trimpath -ldflags "-s -w" "github.com/minio/mc@$MC_MODULE_VERSION"
    echo "$stamp" > "$bin/.versions"
}

# Builder stages trust infra/ca-certificates/*.crt (never copied into final stages).
host_ca() {
    if [[ -n "${MDP_HOST_CA:-}" ]] && compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt infra/ca-certificates/
    fi
}

# PART (first argument): all (default); go (only the Go compile, on this host);
# bases (every image that needs no Go binary). `make e2e-images` runs `go` beside
# `bases` and the service images, then `all`, which finds everything but MinIO and mc.
part=${1:-all}
total=$SECONDS
if [[ $part == go ]]; then
    phase "minio + mc (Go modules)" go_binaries
    exit 0
fi
phase "extra CA certificates" host_ca
phase "debian (debootstrap)" debian_base
phase "python" build python "$PYTHON"
phase "jre" build jre "$JRE"
phase "maven" build maven "$MAVEN"
phase "spark" build spark "$SPARK" --build-arg "SPARK_VERSION=$SPARK_VERSION"
phase "kafka" build kafka "$KAFKA"
phase "prometheus" build prometheus "$PROMETHEUS"
phase "postgres" build postgres "$POSTGRES"
if [[ $part == all ]]; then
    phase "minio + mc (Go modules)" go_binaries
    phase "minio" build minio "$MINIO"
    phase "mc" build mc "$MC"
fi
printf '[images] offline image set (%s) ready in %ds\n' "$part" $((SECONDS - total))
