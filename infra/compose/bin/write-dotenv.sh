#!/bin/sh
# Record the compose files `make up` used as COMPOSE_FILE in the project's .env,
# which the Compose CLI reads itself: a plain `docker compose ...` typed next
# (docs/docker.md, README "The Docker way") then works on the same files, e.g.
# `docker compose --profile client run --rm test-client history ...` after
# `make up IMAGES=offline` does not recreate the running services from upstream
# images. Other lines of the file are kept; a COMPOSE_FILE in the shell's
# environment (or -f) still wins over the file, as Compose always does.
#
#   write-dotenv.sh ENV_FILE COMPOSE_FILES     (COMPOSE_FILES: colon-separated)
set -eu
env_file=${1:?usage: write-dotenv.sh ENV_FILE COMPOSE_FILES}
files=${2:?usage: write-dotenv.sh ENV_FILE COMPOSE_FILES}
marker="# written by make up (infra/compose/bin/write-dotenv.sh): the compose files it used"

tmp="$env_file.tmp.$$"
trap 'rm -f "$tmp"' EXIT
{
    if [ -f "$env_file" ]; then
        grep -v -e '^COMPOSE_FILE=' -e "^$marker\$" "$env_file" || true
    fi
    printf '%s\nCOMPOSE_FILE=%s\n' "$marker" "$files"
} >"$tmp"
mv "$tmp" "$env_file"
