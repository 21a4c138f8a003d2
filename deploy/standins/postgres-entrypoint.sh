#!/bin/sh
# The stand-in postgres:15's entrypoint (postgres.Containerfile): what the official image's
# does that Recal's compose file and manifests rely on. At the first start (an empty $PGDATA):
# initdb with the superuser POSTGRES_USER (default postgres) and the password POSTGRES_PASSWORD
# or the content of POSTGRES_PASSWORD_FILE (trailing newlines dropped), scram-sha-256 over
# TCP from anywhere, trust on the local socket; then the database POSTGRES_DB (default the
# user's name). Every start: postgres listening on *:5432.
set -eu
if [ "${1:-postgres}" != postgres ]; then exec "$@"; fi
[ $# -gt 0 ] && shift
user=${POSTGRES_USER:-postgres}
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
  POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE")
fi
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "postgres stand-in: set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE" >&2
    exit 1
  fi
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
  initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C.UTF-8 -D "$PGDATA"
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  if [ "$db" != postgres ]; then
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
    createdb --username="$user" "$db"
    pg_ctl -D "$PGDATA" -m fast -w stop
  fi
  echo "postgres stand-in: initialised (user $user, database $db)"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
