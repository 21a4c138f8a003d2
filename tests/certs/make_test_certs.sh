#!/usr/bin/env bash
# Test certificates for TLS and mTLS, made when a test runs (never committed: a key in the
# repository would outlive its purpose, and a certificate made long ago would expire):
#
#   make_test_certs.sh OUTDIR
#
# writes into OUTDIR (made if missing; files there are replaced):
#   ca.pem / ca.key              the test CA (CN=Recal test CA, 2 days)
#   server.pem / server.key      CN=localhost, SAN DNS:localhost, IP:127.0.0.1, serverAuth, 1 day
#   client.pem / client.key      CN=trainer-a, SAN DNS:trainer-a.example, clientAuth, 1 day
#   expired.pem / expired.key    the same identity as client.pem, valid only on 2020-01-01
#   other_ca.pem / other_ca.key  a second, unrelated CA (CN=Recal other CA)
#   stranger.pem / stranger.key  CN=trainer-a again, but signed by the other CA: a name is
#                                worth nothing without the right issuer
# Keys are P-256 (fast to make), mode 0600. Debian 12's openssl CLI (3.0) only: its x509
# cannot set a start date in the past, so leaf certificates go through `openssl ca`, whose
# -startdate/-enddate can. Quiet on success; on failure openssl's output and a non-zero exit.
set -euo pipefail

if [[ $# -ne 1 || -z "$1" ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)  # absolute: the work below happens elsewhere
umask 077
work=$(mktemp -d "${TMPDIR:-/tmp}/recal-certs.XXXXXX")
trap 'rm -rf "$work"' EXIT
log=$work/log

# openssl is chatty on stderr even when it succeeds.
run() {
  if ! "$@" >>"$log" 2>&1; then
    cat "$log" >&2
    echo "make_test_certs.sh: failed: $*" >&2
    exit 1
  fi
}

# One config for everything, so that nothing depends on /etc/ssl/openssl.cnf.
cat >"$work/openssl.cnf" <<'CNF'
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[ca]
default_ca = signer
[signer]
database = index.txt
new_certs_dir = .
serial = serial
default_md = sha256
policy = any_name
unique_subject = no
email_in_dn = no
copy_extensions = none
[any_name]
commonName = supplied
[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectAltName = DNS:trainer-a.example
authorityKeyIdentifier = keyid
CNF

cd "$work"

key() { run openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key"; }

# make_ca NAME CN
make_ca() {
  key "$1"
  run openssl req -config openssl.cnf -x509 -new -key "$1.key" -subj "/CN=$2" -days 2 \
    -extensions ca_ext -out "$1.pem"
}

# make_leaf NAME CA CN EXTENSIONS VALIDITY...: VALIDITY is `-days N` or `-startdate D -enddate D`.
make_leaf() {
  local name=$1 ca=$2 cn=$3 ext=$4
  shift 4
  key "$name"
  run openssl req -config openssl.cnf -new -key "$name.key" -subj "/CN=$cn" -out "$name.csr"
  : >index.txt
  run openssl rand -hex -out serial 16
  run openssl ca -batch -config openssl.cnf -cert "$ca.pem" -keyfile "$ca.key" -in "$name.csr" \
    -out "$name.pem" -extfile openssl.cnf -extensions "$ext" -notext "$@"
}

make_ca ca "Recal test CA"
make_ca other_ca "Recal other CA"
make_leaf server ca localhost server_ext -days 1
make_leaf client ca trainer-a client_ext -days 1
make_leaf expired ca trainer-a client_ext -startdate 20200101000000Z -enddate 20200102000000Z
make_leaf stranger other_ca trainer-a client_ext -days 1

# Each file replaced whole (mv within one file system), so a reader never sees half of one.
for name in ca server client expired other_ca stranger; do
  for ext in pem key; do
    cp "$name.$ext" "$out/.$name.$ext.tmp"
    mv -f "$out/.$name.$ext.tmp" "$out/$name.$ext"
  done
  chmod 644 "$out/$name.pem"  # certificates are public; the keys stay 0600
done
