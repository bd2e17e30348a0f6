#!/bin/bash
# The offline postgres image's entry point: what the upstream image's does on the
# first start of an empty data directory, for the variables the platform uses:
#   POSTGRES_PASSWORD (required then), POSTGRES_USER (default postgres),
#   POSTGRES_DB (default: the user's name)
# initdb with that superuser and password, scram-sha-256 for every TCP client (trust
# on the container's own Unix socket), listen on every interface of the container,
# and the database created. Then, and on every later start, exec the command.
set -euo pipefail
: "${PGDATA:=/var/lib/postgresql/data}"

if [[ "${1:-}" == postgres && ! -s "$PGDATA/PG_VERSION" ]]; then
    : "${POSTGRES_PASSWORD:?is not set: the data directory is empty and needs a superuser password}"
    user=${POSTGRES_USER:-postgres}
    db=${POSTGRES_DB:-$user}
    pwfile=$(mktemp)
    trap 'rm -f "$pwfile"' EXIT
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --pgdata="$PGDATA" --username="$user" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C >/dev/null
    rm -f "$pwfile"
    printf "listen_addresses = '*'\n" >> "$PGDATA/postgresql.conf"
    printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
    if [[ "$db" != postgres ]]; then
        # Single-user mode: no server (and no client) before the database exists.
        if ! out=$(printf 'CREATE DATABASE "%s";\n' "${db//\"/\"\"}" |
            postgres --single -D "$PGDATA" postgres 2>&1) || [[ "$out" == *ERROR* ]]; then
            echo "docker-entrypoint.sh: CREATE DATABASE $db failed: $out" >&2
            exit 1
        fi
    fi
    echo "docker-entrypoint.sh: initialised $PGDATA (user $user, database $db)"
fi
exec "$@"
