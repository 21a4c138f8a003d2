#!/bin/sh
# The image's ENTRYPOINT (/usr/local/bin/recal-entrypoint): recal-server with the given
# arguments, after one step a secret cannot take by itself. RECAL_PGPASSWORD_FILE, a file
# holding only the PostgreSQL password (compose: /run/secrets/recal_pg_password; Kubernetes:
# a Secret volume), becomes libpq's PGPASSWORD, so the password is in neither the image, the
# command line nor the container's configuration. recal-server's sandboxed workers get none of
# its environment (only PATH and LANG): they never see it. Unset, nothing changes. As PID 1
# it stays, as a minimal init, recal-server's parent (below).
set -eu
if [ -n "${RECAL_PGPASSWORD_FILE:-}" ]; then
  if [ ! -r "$RECAL_PGPASSWORD_FILE" ]; then
    echo "recal-entrypoint: RECAL_PGPASSWORD_FILE=$RECAL_PGPASSWORD_FILE is not a readable file" >&2
    exit 1
  fi
  # $(...) drops trailing newlines, as the postgres image's POSTGRES_PASSWORD_FILE does.
  PGPASSWORD=$(cat "$RECAL_PGPASSWORD_FILE")
  export PGPASSWORD
  unset RECAL_PGPASSWORD_FILE
fi
# As the container's PID 1 (no `init: true` / `--init`; Kubernetes), stay as a minimal init,
# so that recal-server is not PID 1 (which the kernel gives no default signal actions and
# every orphan to reap; recal-worker learns the server's pid from it, so either works).
# SIGTERM and SIGHUP are passed on, SIGINT as SIGTERM (a background command of sh starts
# with SIGINT ignored); the exit status is recal-server's.
if [ "$$" -eq 1 ]; then
  recal-server "$@" &
  server=$!
  trap 'kill -TERM "$server" 2>/dev/null' TERM INT
  trap 'kill -HUP "$server" 2>/dev/null' HUP
  status=0
  # wait returns early (> 128) when a trapped signal arrives: wait again until it has exited.
  while :; do
    wait "$server" && status=0 || status=$?
    kill -0 "$server" 2>/dev/null || break
  done
  exit "$status"
fi
exec recal-server "$@"
