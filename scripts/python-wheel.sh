#!/usr/bin/env bash
# Builds the Python package `recal` (client/python) as an sdist and a wheel, with no CMake
# build: the sdist from a clean copy of client/python and proto/ (so that a built
# recal/_proto/ or setuptools' leftovers in the checkout cannot get in; the sdist carries
# proto/), then the wheel from that sdist as pip builds it for a user (build isolation
# installs grpcio-tools from PyPI, which generates the gRPC stubs: client/python/setup.py).
# Prints the two paths.
# usage: python-wheel.sh [OUT_DIR]   (default dist/; RECAL_PYTHON: the python that builds,
#                                      default .venv/bin/python, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
python=${RECAL_PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
if ! "$python" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 61)' 2>/dev/null; then
  echo "python-wheel.sh: $python needs setuptools>=61 to make the sdist: $python -m pip install 'setuptools>=61'" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out" "$work/client"
cp -r proto "$work/proto"
tar -C client -cf - --exclude=python/recal/_proto --exclude=python/build --exclude=python/dist \
    --exclude='*.egg-info' --exclude=__pycache__ python | tar -C "$work/client" -xf -
# setuptools logs to stdout: the file name is the last line.
sdist=$(cd "$work/client/python" &&
        "$python" -c 'import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))' \
          "$out" | tail -n 1)
"$python" -m pip wheel -q --disable-pip-version-check --no-deps --wheel-dir "$work/wheel" "$out/$sdist"
wheel=$(basename "$work"/wheel/*.whl)
mv "$work/wheel/$wheel" "$out/$wheel"
echo "$out/$sdist"
echo "$out/$wheel"
