#!/usr/bin/env bash
# The main job, end to end on a fresh Debian 12 machine: install packages, build what the
# demo runs (the programs and the fixtures: not the test suite), make a real torchvision
# ResNet-18 exported with torch.export (a .pt2 program) and data, recalibrate it with recal-run
# and through recal-server (upload, submit, watch, download), and check both results from
# Python (they load with torch.export.load and match the float64 reference). Each step says
# how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
step() {  # step NAME COMMAND...: runs it, then says how long it took
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "demo: $name took $((SECONDS - start)) s"
}
step "installing packages" scripts/install-deps.sh
step "building recal-run, recal-server, recal-worker, recalctl and the fixtures" \
  scripts/build.sh recal-run recal-server recal-worker recalctl fixtures
out=demo-out
python=.venv/bin/python  # the project venv (build.sh makes it: scripts/venv.sh)
mkdir -p "$out"
fixtures=build/fixtures
step "recalibrating with recal-run" build/bin/recal-run \
  --model "$fixtures/models/resnet18.exported_train.pt2" \
  --data "npy:$PWD/$fixtures/data/resnet18.npy" \
  --batch_size 8 \
  --out "$out/resnet18.recalibrated.pt2" \
  --bn_out "$out/resnet18.bn.safetensors" \
  --report "$out/resnet18.report.json"
step "checking recal-run's result" "$python" scripts/demo_check.py "$out" "$fixtures"
step "recalibrating through recal-server" \
  "$python" scripts/demo_server.py --server build/bin/recal-server --fixtures "$fixtures" --out "$out"
