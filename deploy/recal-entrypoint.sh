#!/bin/sh
# The image's ENTRYPOINT (/usr/local/bin/recal-entrypoint): recal-server with the given
# arguments, after one step a secret cannot take by itself. RECAL_PGPASSWORD_FILE, a file
# holding only the PostgreSQL password (compose: /run/secrets/recal_pg_password; Kubernetes:
# a Secret volume), becomes libpq's PGPASSWORD, so the password is in neither the image, the
# command line nor the container's configuration. recal-server's sandboxed workers get none of
# its environment (only PATH and LANG): they never see it. Unset, nothing changes.
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
exec recal-server "$@"
