#!/usr/bin/env bash
# Start a throw-away PostgreSQL server for the test suite (issue 16, R-DB-7) and print its URL.
#
#   eval "$(scripts/pg-test-server.sh start DIR)"   # exports LEDGER_TEST_PG_URL
#   scripts/pg-test-server.sh stop DIR
#
# Installs Debian's postgresql package (apt-get) when pg_ctl is missing. The server listens on a
# unix socket in DIR only (no TCP port to collide with other runs), trusts local connections and
# keeps its data in DIR, so deleting DIR removes every trace. As root it runs as `postgres`.
set -euo pipefail

action=${1:?usage: pg-test-server.sh start|stop DIR}
dir=${2:?usage: pg-test-server.sh start|stop DIR}

find_bin() {
    local name=$1 found
    found=$(command -v "$name" 2>/dev/null || true)
    if [ -z "$found" ]; then
        found=$(ls -d /usr/lib/postgresql/*/bin/"$name" 2>/dev/null | sort -V | tail -n 1 || true)
    fi
    printf '%s' "$found"
}

as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

pg_ctl=$(find_bin pg_ctl)
if [ "$action" = stop ]; then
    [ -n "$pg_ctl" ] && [ -d "$dir/data" ] && as_owner "$pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    exit 0
fi
if [ -z "$pg_ctl" ]; then
    echo "pg-test-server: pg_ctl missing, installing postgresql (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    pg_ctl=$(find_bin pg_ctl)
fi
bindir=$(dirname "$(readlink -f "$pg_ctl")")

mkdir -p "$dir"
chmod 0755 "$dir"
[ "$(id -u)" = 0 ] && chown postgres "$dir"
as_owner "$bindir/initdb" -D "$dir/data" -U ledger --auth=trust -E UTF8 --no-locale >/dev/null
# Enough connections for the 8-process contention bench and the race tests beside the suite.
as_owner "$pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-c listen_addresses='' -c unix_socket_directories='$dir' -c max_connections=200" \
    start >/dev/null
echo "export LEDGER_TEST_PG_URL='postgresql+psycopg://ledger@/postgres?host=$dir'"
