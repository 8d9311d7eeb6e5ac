#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback for the tests.
#   scripts/test-postgres.sh start [--install]   prints the server's URL (data under a new temp dir)
#   scripts/test-postgres.sh stop URL_OR_DIR
# --install installs Debian's postgresql package first when no server binaries are found.
set -euo pipefail
find_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

case "${1:-}" in
start)
    bin=$(find_bin)
    if [ -z "$bin" ] && [ "${2:-}" = "--install" ]; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
        bin=$(find_bin)
    fi
    [ -n "$bin" ] || { echo "no PostgreSQL server binaries (apt-get install postgresql)" >&2; exit 3; }
    dir=$(mktemp -d /tmp/worldsmith-pg-XXXXXX)
    chmod 755 "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >/dev/null
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
    echo "postgresql://postgres@127.0.0.1:$port/postgres?pgdir=$dir"
    ;;
stop)
    dir="${2##*pgdir=}"
    bin=$(find_bin)
    [ -d "$dir/data" ] && as_pg "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    ;;
*)
    echo "usage: $0 start [--install] | stop URL_OR_DIR" >&2
    exit 2
    ;;
esac
