#!/usr/bin/env bash
# The benchmarks, after scripts/build.sh: (1) recalibration vs plain train-mode forward in
# one process, interleaved; (2) recal-run vs fvcore's estimator in Python, whole process
# against whole process; (3) recal-server: upload throughput, and a job through the server vs
# recal-run. Each prints its own table. Takes ~10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${THREADS:-2}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 - "$tmp/resnet18.pt" <<'PY'
import sys
sys.path.insert(0, "tests/fixtures")
import torch
import models
model, _ = models.build("resnet18")
torch.jit.save(torch.jit.script(model.eval()), sys.argv[1])
PY
build/bin/recalibration_overhead --model "$tmp/resnet18.pt" --batch_size 32 --shape 3x112x112 \
  --batches 10 --reps 7 --threads "$threads"
echo
/usr/bin/python3 bench/fvcore_compare.py --bin build/bin/recal-run --threads "$threads" \
  --batches 20 --batch_size 32 --size 112 --repeats 3
echo
/usr/bin/python3 bench/server_bench.py --server build/bin/recal-server --run build/bin/recal-run
