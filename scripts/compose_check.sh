#!/usr/bin/env bash
# The images and the cluster compose file, run (issue 49, item 3): builds the api and worker
# images with podman and the local stand-ins for postgres:15 and prom/prometheus
# (deploy/standins/: the official images cannot be pulled where this was written), brings up
# deploy/docker-compose.cluster.yml with podman-compose (PostgreSQL, two api replicas, two
# workers, Prometheus), waits until every service is healthy, runs one job end to end through
# an api replica with recalctl (a real torchvision ResNet-18 and data made by the project
# venv; the result checked in Python) and the same data again pushed by the client through the
# other replica (--stream: relayed to the worker with the cluster secret; the same statistics,
# byte for byte), checks that Prometheus scrapes every recal process, then runs two longer
# jobs, one on each worker, SIGKILLs the container of the worker running the first, starts it
# again, and checks that the first still SUCCEEDS as attempt 2 (docs/cluster.md, "Dead
# workers": its lease runs out, it goes back to the queue with its attempts counted and runs
# on a worker) and the second as attempt 1 (a worker that starts takes back expired leases
# only). Prints the image sizes and every step's time, tears everything down, exits 1 on any
# failed check.
#
# Run by hand, as root, on a Linux host with podman (not in CI: a cold build of the worker
# image takes half an hour or more on 2 cores and downloads the torch wheel's 4 GB). Set up as
# ../shared/container-notes.md says where there is no Docker Hub:
#   apt-get install podman buildah runc debootstrap podman-compose
#   /etc/containers/containers.conf (default_ulimits, runtime = "runc" where needed)
#   a base image debian:bookworm-slim (--make-base makes one with debootstrap)
#
# usage: scripts/compose_check.sh [--reuse-images] [--make-base] [--python PY] [--keep]
#                                 [--work DIR] [--host-ca FILE] [--version V]
#   --reuse-images  build no image that exists already (default: build all four; the same
#                   tree builds again in seconds from podman's layer cache, a changed one
#                   compiles again with ccache and copies the wheel's libraries again:
#                   18 min here)
#   --make-base     make debian:bookworm-slim with debootstrap --variant=minbase first (when
#                   it does not exist), from the mirror of the host's apt sources
#   --python PY     a python with torch and torchvision, which makes the model and data and
#                   checks the result (default .venv/bin/python; waited for up to 30 min)
#   --keep          leave the cluster up and the work directory in place
#   --work DIR      the work directory (default: a new one under /tmp)
#   --host-ca FILE  a CA bundle pip in the build stage must trust (a TLS proxy's), mounted
#                   for the build only, in no layer (default: $PIP_CERT when it is set)
#   --version V     the images' RECAL_VERSION (default compose-check)
set -euo pipefail
cd "$(dirname "$0")/.."

reuse=0 make_base=0 keep=0 python=.venv/bin/python work="" host_ca=${PIP_CERT:-} version=compose-check
while [ $# -gt 0 ]; do
  case $1 in
    --reuse-images) reuse=1 ;;
    --make-base) make_base=1 ;;
    --keep) keep=1 ;;
    --python) python=$2; shift ;;
    --work) work=$2; shift ;;
    --host-ca) host_ca=$2; shift ;;
    --version) version=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "compose_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

project=recal-check
compose_file=deploy/docker-compose.cluster.yml
api_image=recal-server-api:latest       # the compose file's image names
worker_image=recal-server:latest
pg_image=docker.io/library/postgres:15
prom_image=docker.io/prom/prometheus:v2.53.0
api1=127.0.0.1:50051 api2=127.0.0.1:50052 prom=http://127.0.0.1:9090  # the published ports

failures=0
summary=()
say() { echo "compose_check: $*"; }
fail() { say "FAILED: $*"; failures=$((failures + 1)); }
pass() { say "ok: $*"; }
die() { say "FAILED: $*"; exit 1; }
# step NAME COMMAND...: runs it and records how long it took
step() {
  local name=$1 start=$SECONDS
  shift
  say "-- $name"
  "$@"
  summary+=("$(printf '%-58s %5d s' "$name" $((SECONDS - start)))")
}
ctr() { echo "${project}_$1_1"; }  # podman-compose 1.0.3's container names
compose() { podman-compose -p "$project" -f "$compose_file" "$@"; }

[ "$(id -u)" -eq 0 ] || die "run as root (rootful podman: named volumes owned by uid 10001, port publishing)"
for tool in podman podman-compose curl jq; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done

# ---- work directory: secrets, calibration data, the client's files
if [ -z "$work" ]; then work=$(mktemp -d /tmp/compose-check.XXXXXX); fi
mkdir -p "$work"
work=$(cd "$work" && pwd)
# podman-compose 1.0.3's `down -v` removes the named volumes only: the images' VOLUMEs
# (/var/lib/recal, /prometheus) are removed here too.
teardown() {
  local ids volumes=""
  ids=$(podman ps -a -q --filter "label=io.podman.compose.project=$project")
  if [ -n "$ids" ]; then
    # shellcheck disable=SC2086
    volumes=$(podman inspect -f '{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} {{end}}{{end}}' $ids)
  fi
  compose down -v >>"$work/down.log" 2>&1 || say "down failed: $work/down.log"
  # shellcheck disable=SC2086
  [ -z "${volumes// /}" ] || podman volume rm $volumes >>"$work/down.log" 2>&1 || true
}
cleanup() {
  local rc=$?
  if [ "$keep" -eq 0 ]; then
    say "tearing down (podman-compose down -v, and the containers' anonymous volumes)"
    teardown
    rm -rf "$work"
  else
    say "kept: the cluster (podman-compose -p $project -f $compose_file down -v) and $work"
  fi
  exit "$rc"
}
trap cleanup EXIT

# ---- images
make_base() {
  podman image exists debian:bookworm-slim && return 0
  command -v debootstrap >/dev/null || die "debootstrap is not installed"
  local mirror rootfs=$work/rootfs
  mirror=$(grep -h -o -m1 -E 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -1 | tr -d ' ' || true)
  debootstrap --variant=minbase bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >"$work/debootstrap.log"
  rm -f "$rootfs/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/*.sources "$rootfs/etc/apt/sources.list.d/" 2>/dev/null || cp /etc/apt/sources.list "$rootfs/etc/apt/"
  chroot "$rootfs" apt-get clean
  rm -rf "$rootfs/var/lib/apt/lists/"*
  tar -C "$rootfs" -c . | podman import --change 'CMD ["bash"]' - debian:bookworm-slim >/dev/null
  podman tag debian:bookworm-slim docker.io/library/debian:bookworm-slim
  rm -rf "$rootfs"
}
if [ "$make_base" -eq 1 ]; then step "base image (debootstrap)" make_base; fi
podman image exists debian:bookworm-slim || die "no image debian:bookworm-slim (pull it, or --make-base)"

build_args=(--format docker --network host)  # docker format: keeps the HEALTHCHECK
recal_build() {  # recal_build TARGET TAG
  if [ "$reuse" -eq 1 ] && podman image exists "$2"; then say "reusing $2"; return 0; fi
  local ca=()
  if [ -n "$host_ca" ]; then
    printf '[global]\ncert = /run/host-ca.crt\n' >"$work/pip.conf"
    ca=(-v "$host_ca:/run/host-ca.crt:ro" -v "$work/pip.conf:/etc/pip.conf:ro")
  fi
  podman build "${build_args[@]}" "${ca[@]}" --build-arg RECAL_VERSION="$version" \
    --target "$1" -t "$2" -f Dockerfile . >"$work/build-$1.log" 2>&1 \
    || { tail -30 "$work/build-$1.log"; die "podman build --target $1 (log above)"; }
}
standin_build() {  # standin_build NAME TAG
  if [ "$reuse" -eq 1 ] && podman image exists "$2"; then say "reusing $2"; return 0; fi
  podman build "${build_args[@]}" -t "$2" -f "deploy/standins/$1.Containerfile" deploy/standins \
    >"$work/build-$1.log" 2>&1 || { tail -30 "$work/build-$1.log"; die "podman build $1 stand-in"; }
}
step "image: worker (default target)" recal_build worker "$worker_image"
step "image: api (--target api)" recal_build api "$api_image"
step "image: postgres:15 stand-in" standin_build postgres "$pg_image"
step "image: prometheus stand-in" standin_build prometheus "$prom_image"

# The api image holds no LibTorch and every library its binaries link.
ldd_api=$(podman run --rm --no-healthcheck --entrypoint sh "$api_image" -c 'ldd /usr/local/bin/recal-server /usr/local/bin/recalctl')
if grep -q "not found" <<<"$ldd_api"; then fail "api image: a library is missing: $(grep 'not found' <<<"$ldd_api" | sort -u | tr '\n' ' ')"
elif grep -q -E "libtorch|libc10" <<<"$ldd_api"; then fail "api image: recal-server links LibTorch"
else pass "api image: ldd of recal-server and recalctl finds every library, none of LibTorch"; fi
if podman run --rm --no-healthcheck --entrypoint sh "$api_image" -c 'test -e /usr/local/bin/recal-worker'; then
  fail "api image: holds recal-worker"
fi

# ---- secrets, data and model
mkdir -p "$work/calibration" "$work/client/out"
token_out=$(podman run --rm --no-healthcheck --entrypoint recalctl "$api_image" token new --tenant compose-check --role submit)
token=$(sed -n 1p <<<"$token_out")
sed -n 2p <<<"$token_out" >"$work/auth.txt"
(umask 077 && echo "$token" >"$work/token")  # for a look at a --keep cluster by hand
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/pg_password.txt"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/internal_token.txt"
# Compose mounts file secrets as they are: readable by uid 10001 (and the stand-in's postgres).
chmod 0644 "$work/auth.txt" "$work/pg_password.txt" "$work/internal_token.txt"

wait_python() {
  local i
  for i in $(seq 1 180); do
    if [ -x "$python" ] && "$python" -c 'import torch, torchvision' 2>/dev/null; then return 0; fi
    [ "$i" -eq 1 ] && say "waiting for $python with torch and torchvision (up to 30 min)"
    sleep 10
  done
  die "$python with torch and torchvision did not appear"
}
step "python with torch" wait_python
make_model() {
  # A real torchvision ResNet-18 (seeded random weights: nothing is downloaded), traced in
  # train mode, and 96 images' worth of N(0,1) data at 3x96x96 for the end-to-end job.
  "$python" - "$work" <<'EOF'
import sys, numpy as np, torch, torchvision
work = sys.argv[1]
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=10).train()
x = torch.randn(96, 3, 96, 96)
torch.jit.trace(model, x[:2]).save(f"{work}/client/resnet18.traced_train.pt")
np.save(f"{work}/calibration/calib.npy", x.numpy())
np.save(f"{work}/client/calib.npy", x.numpy())  # the client's copy, for --stream
EOF
}
step "model and data (torchvision ResNet-18, 96x3x96x96)" make_model
chown -R 10001:10001 "$work/client"
chmod 0755 "$work" "$work/calibration"
chmod 0644 "$work/calibration/calib.npy"

export RECAL_AUTH_FILE=$work/auth.txt RECAL_PG_PASSWORD_FILE=$work/pg_password.txt \
  RECAL_INTERNAL_TOKEN_FILE=$work/internal_token.txt RECAL_CALIBRATION_DIR=$work/calibration \
  RECAL_VERSION=$version
# recalctl from the api image, on the host's network: through the published ports. A call
# that finds no server (exit 3: on a loaded host a connection can time out) is tried again, up
# to 5 times; submits carry a --request_id, so that a retried one makes no second job.
recalctl() {
  local try rc
  for try in 1 2 3 4 5; do
    rc=0
    podman run --rm --no-healthcheck --network host --entrypoint recalctl -e RECAL_TOKEN="$token" \
      -v "$work/client:/w" "$api_image" "$@" || rc=$?
    [ "$rc" -eq 3 ] || return "$rc"
    say "recalctl $1 $2 $3: no server answered (try $try of 5)" >&2
    sleep 3
  done
  return "$rc"
}

# ---- the cluster
if podman ps -a --format '{{.Names}}' | grep "^${project}_" >/dev/null; then
  say "a $project cluster is left from an earlier run: removing it"
  teardown
fi
for port in 50051 50052 9090; do
  if ss -ltnH "sport = :$port" | grep . >/dev/null; then die "port $port is taken on this host (the compose file publishes it)"; fi
done
services=(postgres api-1 api-2 worker-1 worker-2)
wait_healthy() {
  local s pending i
  for i in $(seq 1 120); do
    pending=()
    for s in "${services[@]}"; do
      podman healthcheck run "$(ctr "$s")" >/dev/null 2>&1 || pending+=("$s")
    done
    if [ ${#pending[@]} -eq 0 ]; then return 0; fi
    sleep 2
  done
  for s in "${pending[@]}"; do podman logs --tail 20 "$(ctr "$s")" 2>&1 | sed "s/^/  $s: /"; done
  die "not healthy after 240 s: ${pending[*]}"
}
up() { compose up -d --no-build >"$work/up.log" 2>&1 || { tail -30 "$work/up.log"; die "podman-compose up"; }; }
step "podman-compose up -d" up
step "all five healthy (podman healthcheck run)" wait_healthy
pass "postgres, api-1, api-2, worker-1 and worker-2 healthy"
podman ps -a --filter "label=io.podman.compose.project=$project" --format '{{.Names}}\t{{.Image}}\t{{.Status}}'
for s in api-1 api-2 worker-1 worker-2; do
  podman exec "$(ctr "$s")" id -u | grep -qx 10001 || fail "$s: not uid 10001"
done

# ---- one job end to end through api-1, read back through api-2
job1() {
  recalctl --server "$api1" -q --deadline 120 run /w/resnet18.traced_train.pt --name resnet18 \
    --data npy:calib.npy --batch_size 16 -o /w/out/out.pt --bn_out /w/out/bn.safetensors \
    --report /w/out/report.json --output json >"$work/job1.json" \
    || { cat "$work/job1.json"; die "recalctl run through api-1"; }
}
step "job 1: recalctl run through api-1" job1
job1_id=$(jq -r '.id' "$work/job1.json")
state=$(recalctl --server "$api2" --output json get "$job1_id" | jq -r '.state')
if [ "$state" = SUCCEEDED ]; then pass "job 1 $job1_id SUCCEEDED (read through api-2)"; else fail "job 1 through api-2: $state"; fi
check_result() {
  # The first BatchNorm's new running_mean is the mean of conv1's output over the data: exact
  # for any estimator, and independent of the rest of the network.
  "$python" - "$work" <<'EOF'
import json, sys, numpy as np, torch
work = sys.argv[1]
out = torch.jit.load(f"{work}/client/out/out.pt")
x = torch.from_numpy(np.load(f"{work}/calibration/calib.npy")).double()
ref = torch.jit.load(f"{work}/client/resnet18.traced_train.pt")
w = ref.state_dict()["conv1.weight"].double()
mean = torch.nn.functional.conv2d(x, w, stride=2, padding=3).mean(dim=(0, 2, 3))
got = out.state_dict()["bn1.running_mean"].double()
err = (got - mean).abs().max().item()
report = json.load(open(f"{work}/client/out/report.json"))
print(f"bn1.running_mean vs float64 reference: max abs error {err:.2e}; "
      f"{report.get('samples_per_second', 0):.1f} samples/s on {report.get('device')}")
sys.exit(0 if err < 1e-4 else 1)
EOF
}
if check_result; then pass "job 1's model: bn1.running_mean matches the data's conv1 mean"; else fail "job 1's result"; fi
sps=$(jq -r '.samples_per_second // 0' "$work/client/out/report.json")

# ---- the same data pushed by the client through api-2 (--stream): api-2 relays the batches to
# the worker running the job over its internal endpoint, with the cluster secret.
job_stream() {
  recalctl --server "$api2" -q --deadline 120 run resnet18 --stream --data npy:/w/calib.npy \
    --batch_size 16 -o /w/out/stream.pt --bn_out /w/out/stream_bn.safetensors --output json \
    >"$work/job_stream.json" || { cat "$work/job_stream.json"; die "recalctl run --stream through api-2"; }
}
step "job 1 again, its batches pushed through api-2 (--stream)" job_stream
if cmp -s "$work/client/out/bn.safetensors" "$work/client/out/stream_bn.safetensors"; then
  pass "the streamed job's BN buffers are byte-identical to job 1's"
else
  fail "the streamed job's BN buffers differ from job 1's"
fi

# ---- Prometheus scrapes every recal process
wait_targets() {
  local i json up total
  for i in $(seq 1 45); do
    json=$(curl -sf "$prom/api/v1/targets" || true)
    total=$(jq '[.data.activeTargets[]?] | length' <<<"${json:-{\}}")
    up=$(jq '[.data.activeTargets[]? | select(.health == "up")] | length' <<<"${json:-{\}}")
    if [ "$total" -eq 4 ] && [ "$up" -eq 4 ]; then
      jq -r '.data.activeTargets[] | "  \(.labels.instance) role=\(.labels.role) \(.health) (last scrape \(.lastScrapeDuration)s)"' <<<"$json"
      return 0
    fi
    sleep 2
  done
  jq -r '.data.activeTargets[]? | "  \(.labels.instance) \(.health) \(.lastError)"' <<<"${json:-{\}}"
  fail "Prometheus: $up of $total targets up after 90 s"
}
step "Prometheus: every target up" wait_targets
build_info=$(curl -sf "$prom/api/v1/query" --data-urlencode 'query=recal_build_info' |
  jq -r '[.data.result[].metric | "\(.role)@\(.instance) \(.version)"] | sort | join(", ")')
say "recal_build_info: $build_info"
if [ "$(grep -o "@" <<<"$build_info" | wc -l)" -eq 4 ]; then pass "recal_build_info from all four"
else fail "recal_build_info: $build_info"; fi

# ---- a worker SIGKILLed mid-job, while the other runs a job of its own
# Two jobs of about 60 s each at job 1's speed (synthetic data of the same shape), one on each
# worker (each has --cpu_workers=1). The worker running job 2 is SIGKILLed and started again:
# job 2's lease runs out and it runs again (attempt 2); job 3, on the other worker, must not
# be disturbed by the restarted worker (attempt 1: a worker takes back only expired leases).
batches=$(awk -v s="$sps" 'BEGIN { b = int(s * 60 / 16); if (b < 30) b = 30; if (b > 2000) b = 2000; print b }')
submit_long() {  # submit_long API SEED
  recalctl --server "$1" --output json submit --model resnet18 --data "synthetic:3x96x96,seed=$2" \
    --batch_size 16 --max_batches "$batches" --request_id "compose-check-$$-$2" | jq -r '.id'
}
job2=$(submit_long "$api2" 1)
job3=$(submit_long "$api1" 2)
say "jobs 2 ($job2, through api-2) and 3 ($job3, through api-1): $batches batches of 16 each"
get_job() { recalctl --server "$api1" --output json get "$1"; }
started_on() {  # started_on JOB ATTEMPT: the worker whose log says it started it
  local s
  for s in worker-1 worker-2; do
    if podman logs "$(ctr "$s")" 2>&1 | grep "job started job_id=$1 .*attempt=$2\b" >/dev/null; then echo "$s"; return; fi
  done
}
victim="" other=""
wait_running() {
  local i j
  for i in $(seq 1 180); do
    j=$(get_job "$job2")
    victim=$(started_on "$job2" 1) other=$(started_on "$job3" 1)
    if [ -n "$victim" ] && [ -n "$other" ] && [ "$(jq -r '.progress.batchesDone // 0' <<<"$j")" -ge 3 ]; then
      say "job 2 running on $victim: $(jq -c '.progress | {batchesDone, batchesTotal, samplesPerSecond}' <<<"$j")"
      say "job 3 running on $other"
      return 0
    fi
    sleep 1
  done
  die "jobs 2 and 3 did not both start running: $(get_job "$job2" | jq -c '{state, progress}') $(get_job "$job3" | jq -c '{state, progress}')"
}
step "jobs 2 and 3 running, one on each worker" wait_running
t_kill=$SECONDS
podman kill "$(ctr "$victim")" >/dev/null
say "podman kill $(ctr "$victim") (SIGKILL): $(podman inspect -f '{{.State.Status}}, exit code {{.State.ExitCode}}' "$(ctr "$victim")")"
sleep 5
# restart: unless-stopped does not restart a container podman killed (podman 4.3): start it.
if [ "$(podman inspect -f '{{.State.Running}}' "$(ctr "$victim")")" != true ]; then
  podman start "$(ctr "$victim")" >/dev/null
  say "podman start $(ctr "$victim")"
else
  say "$(ctr "$victim") was restarted by its restart policy"
fi
watch_job() {  # watch_job JOB: through api-1, to its end
  recalctl --server "$api1" -q --deadline 900 --output json watch "$1" >/dev/null || true
}
step "job 2 to its end after the kill (watch through api-1)" watch_job "$job2"
t_done=$((SECONDS - t_kill))
step "job 3 to its end" watch_job "$job3"
j2=$(get_job "$job2") j3=$(get_job "$job3")
say "job 2: $(jq -r .state <<<"$j2"), attempts $(jq -r .attempts <<<"$j2"), $t_done s from the kill to its end; attempt 2 on $(started_on "$job2" 2)"
say "job 3: $(jq -r .state <<<"$j3"), attempts $(jq -r .attempts <<<"$j3")"
podman logs "$(ctr "$victim")" 2>&1 | grep -E "re-queued" | sed 's/^/  /' || true
if [ "$(jq -r .state <<<"$j2")" = SUCCEEDED ] && [ "$(jq -r .attempts <<<"$j2")" = 2 ]; then
  pass "job 2 SUCCEEDED as attempt 2 after its worker was killed"
else
  fail "job 2 after the kill: $(jq -c '{state, attempts, error}' <<<"$j2")"
fi
if [ "$(jq -r .state <<<"$j3")" = SUCCEEDED ] && [ "$(jq -r .attempts <<<"$j3")" = 1 ]; then
  pass "job 3 SUCCEEDED as attempt 1 on $other: the restarted worker left it alone"
else
  fail "job 3, on the worker that was not killed: $(jq -c '{state, attempts, error}' <<<"$j3")"
fi
if podman logs "$(ctr "$victim")" 2>&1 | grep "re-queued at start-up job_id=$job3" >/dev/null; then
  fail "the restarted $victim took back job 3, which $other was running (its lease live)"
fi
step "all five healthy again" wait_healthy

# ---- the figures
echo
say "images (podman images, uncompressed):"
for image in "$api_image" "$worker_image" "$pg_image" "$prom_image" debian:bookworm-slim; do
  podman images --format '{{.Repository}}:{{.Tag}}\t{{.Size}}' "$image" | awk 'NR == 1 { print "  " $0 }'
done
say "times:"
printf '  %s\n' "${summary[@]}"
say "job 1: $(jq -r '"\(.progress.samplesDone) samples, \(.progress.samplesPerSecond | floor) samples/s"' "$work/job1.json")"
if [ "$failures" -ne 0 ]; then say "$failures check(s) FAILED"; exit 1; fi
say "all checks passed"
