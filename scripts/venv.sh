#!/usr/bin/env bash
# Creates or updates the project's Python environment, .venv/ (or $RECAL_VENV), from
# scripts/python-requirements.txt with Debian's python3 (python3-venv). Idempotent: does
# nothing when the environment already holds what the requirements file says (a stamp of its
# contents). Prints nothing else on success but one line.
# usage: venv.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${RECAL_VENV:-$PWD/.venv}
requirements=scripts/python-requirements.txt
stamp="$venv/.recal-requirements"
if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp"; then
  echo "venv: $venv is current"
  exit 0
fi
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
cp "$requirements" "$stamp"
echo "venv: $venv installed from $requirements ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
