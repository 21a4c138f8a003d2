#!/usr/bin/env bash
# The benchmarks, after scripts/build.sh: (1) recalibration vs plain train-mode forward in
# one process, interleaved, then the forward's levers (inference mode, channels-last, the
# forward ending at the last BatchNorm) and the fixed costs around the loop; (2) recal-run
# vs fvcore's own update_bn_stats and vs torch.optim.swa_utils.update_bn on ResNet-18,
# MobileNetV2 and ResNet-50, whole process against whole process on the same torch, with
# each family's recalibration / plain train-mode forward, and the exported-program path vs the
# TorchScript path on the same models (bench/exported_vs_script.py); (3) recal-server: upload throughput, and a job through the server vs
# recal-run; (4) image folders (IMAGES=N generated 500x375 q90 JPEGs): decoding throughput
# against threads, a recalibration against max(decode-only, forward-only), and recal-run
# against torchvision ImageFolder + DataLoader + fvcore; (5) the control plane on SQLite vs
# PostgreSQL (API calls/s, tiny jobs/s, failover time); (6) a 64 MiB .npy read in batches
# from a bucket (moto_server on loopback) vs local disk; (7) 10,000 WatchJob streams on one job
# (server threads and RSS, time to the last watcher's end). Each prints its own table. Takes
# ~35 minutes on 2 cores. ONLY=images runs (4) alone. Python is the project's venv
# (scripts/venv.sh): the torch whose LibTorch the binaries link, fvcore, torchvision.
set -euo pipefail
cd "$(dirname "$0")/.."
python="$PWD/.venv/bin/python"
[ -x "$python" ] || { echo "run_benchmarks.sh: no $python (scripts/venv.sh makes it)" >&2; exit 1; }
threads="${THREADS:-2}"
images="${IMAGES:-512}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" - "$tmp/resnet18.pt" <<'PY'
import sys
sys.path.insert(0, "tests/fixtures")
import torch
import models
model, _ = models.build("resnet18")
torch.jit.save(torch.jit.script(model.eval()), sys.argv[1])
PY
if [ "${ONLY:-}" != images ]; then
build/bin/recalibration_overhead --model "$tmp/resnet18.pt" --batch_size 32 --shape 3x112x112 \
  --batches 10 --reps 7 --threads "$threads"
echo
"$python" - "$tmp/mobilenet_v2.pt" <<'PY'
import sys
sys.path.insert(0, "tests/fixtures")
import torch
import models
model, _ = models.build("mobilenet_v2")
torch.jit.save(torch.jit.script(model.eval()), sys.argv[1])
PY
build/bin/forward_levers --models "resnet18=$tmp/resnet18.pt,mobilenet_v2=$tmp/mobilenet_v2.pt" \
  --batch_size 32 --shape 3x112x112 --batches 4 --reps 9 --threads "$threads"
echo
"$python" bench/baselines_compare.py --bin build/bin/recal-run --threads "$threads" \
  --families resnet18,mobilenet_v2,resnet50 --batches 20 --batch_size 32 --size 112 --repeats 5
echo
"$python" bench/exported_vs_script.py --bin build/bin/recal-run --threads "$threads" \
  --families resnet18,mobilenet_v2,resnet50 --batches 20 --batch_size 32 --size 112 --repeats 5
echo
"$python" bench/server_bench.py --server build/bin/recal-server --run build/bin/recal-run
echo
build/bin/control_plane_bench --fixtures build/fixtures
echo
build/bin/sharded_job_bench --model build/fixtures/models/resnet18.traced_eval.pt
echo
build/bin/watch_streams_bench --watchers 10000 --channels 16 --fixtures build/fixtures
echo
build/bin/s3_read_bench --mib 64 --batch_size 64 --reps 5
fi
echo
"$python" bench/make_image_folder.py --out "$tmp/images" --count "$images" --jobs "$(nproc)" >/dev/null
# Decoding and the forward pass share the cores: half each (1 + 1 on 2 cores).
half=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
build/bin/input_pipeline --model "$tmp/resnet18.pt" --folder "$tmp/images" --resize 128 --crop 112 \
  --batch_size 32 --thread_list "1,2,4" --decode_threads "$half" --threads "$half" --reps 3
echo
# The same at 32x32, where decoding and the forward pass take about as long: the hardest
# case for the overlap.
build/bin/input_pipeline --model "$tmp/resnet18.pt" --folder "$tmp/images" --resize 36 --crop 32 \
  --batch_size 32 --thread_list 1 --decode_threads "$half" --threads "$half" --reps 5 | tail -n 6
echo
"$python" bench/image_folder_compare.py --bin build/bin/recal-run --model "$tmp/resnet18.pt" \
  --folder "$tmp/images" --resize 128 --crop 112 --batch_size 32 --workers "$half" --threads "$half" --repeats 3
