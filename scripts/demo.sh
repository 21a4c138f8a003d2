#!/usr/bin/env bash
# The main job, end to end on a fresh Debian 12 machine: install packages, build, make a real
# torchvision ResNet-18 (TorchScript) and data, recalibrate it with recal-run and through
# recal-server (upload, submit, watch, download), and check both results from Python
# (they load with torch.jit.load and match the float64 reference).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
out=demo-out
python=.venv/bin/python  # the project venv (build.sh makes it: scripts/venv.sh)
mkdir -p "$out"
fixtures=build/fixtures
build/bin/recal-run \
  --model "$fixtures/models/resnet18.traced_train.pt" \
  --data "npy:$PWD/$fixtures/data/resnet18.npy" \
  --batch_size 8 \
  --out "$out/resnet18.recalibrated.pt" \
  --bn_out "$out/resnet18.bn.safetensors" \
  --report "$out/resnet18.report.json"
"$python" scripts/demo_check.py "$out" "$fixtures"
"$python" scripts/demo_server.py --server build/bin/recal-server --fixtures "$fixtures" --out "$out"
