#!/usr/bin/env bash
# The GPU path end to end (issue 31), one script for a machine with one NVIDIA GPU: builds
# recal-run, recal-worker, recal-server and recalctl against the chosen python's torch, then
# (scripts/gpu_check.py) ResNet-50 recalibrated on cuda:0 against the float64 reference,
# recalibration's samples/s against a plain train-mode forward on the same GPU (the ratio),
# channels-last and bfloat16 on the GPU, and jobs through recal-server on a sandboxed GPU
# worker; one table, exit 1 on any failed check, all within 8 minutes.
#
# Without a GPU (nvidia-smi lists none) it says "no GPU: CPU dry run", runs the same steps on
# the CPU with ResNet-18 and small batches, and exits 0 when they pass: CI runs that
# (ctest -R gpu_check_dry_run, with --build: nothing rebuilt).
#
# usage: scripts/gpu_check.sh [--python PY] [--build DIR | --build-dir DIR] [--bundle B]
#                             [--targets LIST] [--build-only] [--cpu] [--keep] [--work DIR]
#        scripts/gpu_check.sh --make-bundle DIR
#   --python PY      the python whose torch the binaries are built against and the baseline
#                    runs in (default: /opt/torch/.venv/bin/python where it exists, else the
#                    project's .venv/bin/python)
#   --build DIR      use DIR/bin as it is: nothing is built
#   --build-dir DIR  where to build (default build-gpu/)
#   --bundle B       build and run with the C++ dependencies of B (DIR/recal-bundle.tar.xz
#                    or DIR, made by --make-bundle DIR), for a machine without Debian's -dev
#                    packages and without network
#   --targets LIST   build these instead of the four programs (with --build-only: what a
#                    check of the bundle builds)
#   --build-only     stop once built
#   --cpu            the dry run even where there is a GPU
#   --keep / --work  keep the check's files / put them in DIR
#   --make-bundle DIR  (a Debian 12 machine with apt) the headers, CMake and pkg-config files,
#                    libraries and code generators (protoc, grpc_cpp_plugin, pkgconf) of
#                    scripts/debian-packages-server.txt's libraries and their dependencies,
#                    unpacked under DIR/root (apt-get download + dpkg -x; no root needed) and
#                    packed into DIR/recal-bundle.tar.xz, under the 64 MiB a device run carries
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s.%N)
budget=480

python=""
build=""
build_dir="build-gpu"
targets="recal-run recal-worker recal-server recalctl"
build_only=0
bundle=""
force_cpu=0
passthrough=()
while [ $# -gt 0 ]; do
  case $1 in
    --python) python=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --bundle) bundle=$2; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --build-only) build_only=1; shift ;;
    --cpu) force_cpu=1; shift ;;
    --keep) passthrough+=(--keep); shift ;;
    --work) passthrough+=(--work "$2"); shift 2 ;;
    --make-bundle) make_bundle_dir=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done

say() { echo "gpu_check: $*"; }
die() { echo "gpu_check: $*" >&2; exit 1; }

# ---------------------------------------------------------------- the bundle (made here)

# What a GPU machine with a compiler already has: the C library, the compiler's runtime
# and the kernel headers (libc6-dev's own dependencies). Everything else the libraries need
# is carried.
base_packages=(libc6 libc6-dev libc-dev-bin libcrypt-dev libcrypt1 gcc-12-base libgcc-s1 libstdc++6 linux-libc-dev
               libnsl-dev libnsl2 libtirpc-common libtirpc-dev libtirpc3 rpcsvc-proto)

make_bundle() {
  local dir=$1
  if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
    die "--make-bundle needs apt-get and dpkg (Debian 12)"
  fi
  # The library packages of the server's list (not its build tools or python), plus the
  # pkg-config that CMake's FindPkgConfig runs, and their dependencies.
  local wanted closure packages=()
  mapfile -t wanted < <(sed -n '/^# Libraries/,$p' scripts/debian-packages-server.txt | grep -v -e '^#' -e '^python3')
  mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
                           --no-replaces --no-enhances "${wanted[@]}" pkgconf | grep -v -e '^ ' -e '^<' | sort -u)
  for p in "${closure[@]}"; do
    case " ${base_packages[*]} " in *" $p "*) ;; *) packages+=("$p") ;; esac
  done
  rm -rf "$dir/root" "$dir/debs"
  mkdir -p "$dir/debs" "$dir/root"
  (cd "$dir/debs" && apt-get download "${packages[@]}" >/dev/null)
  for deb in "$dir"/debs/*.deb; do dpkg -x "$deb" "$dir/root"; done
  (cd "$dir/debs" && ls -- *.deb) > "$dir/packages.txt"
  rm -rf "$dir/debs"
  prune_bundle "$dir/root"
  # What travels is the archive: the unpacked tree is close to the 64 MiB a device run carries.
  tar -C "$dir" -cJf "$dir/recal-bundle.tar.xz" root packages.txt
  local bytes
  bytes=$(stat -c %s "$dir/recal-bundle.tar.xz")
  say "bundle $dir/recal-bundle.tar.xz: ${#packages[@]} packages, $(( $(du -sb "$dir/root" | cut -f1) / 1048576 )) MiB" \
      "unpacked, $((bytes / 1048576)) MiB packed (list: $dir/packages.txt)"
  [ "$bytes" -lt $((64 * 1048576)) ] || die "the bundle is $((bytes / 1048576)) MiB, over the 64 MiB a device run carries"
}

# Only what a build and a run use: no documentation, no static libraries (everything links
# the shared ones; no CMake package names one); links kept inside the bundle. (gRPC's other
# language plugins stay: its CMake package checks that every target it names exists.)
prune_bundle() {
  local root=$1
  rm -rf "${root:?}"/usr/share/{doc,man,info,lintian,bug,bash-completion} "${root:?}"/etc "${root:?}"/usr/sbin
  find "$root" -name '*.a' -delete
  find "$root" -type l -lname '/*' | while read -r link; do
    local target
    target=$(readlink "$link")
    ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$root$target")" "$link"
  done
}

if [ -n "${make_bundle_dir:-}" ]; then
  make_bundle "$make_bundle_dir"
  exit 0
fi

# ---------------------------------------------------------------- the bundle (used there)

cmake_args=()
run_lib_path=""
# The bundle's headers, CMake packages, pkg-config files and generators for the build. Its
# libraries are linked by full path (so the binaries' RUNPATH names the bundle); at run time
# LD_LIBRARY_PATH holds only those the machine itself lacks (by soname), so that neither
# the compiler nor this python loads Debian's copy of a library the system has its own of.
use_bundle() {
  local from=$1 root lib pc
  mkdir -p "$build_dir"
  if [ -f "$from" ]; then  # the archive: unpacked once into the build directory
    if ! cmp -s "$from" "$build_dir/bundle/recal-bundle.tar.xz"; then
      rm -rf "$build_dir/bundle" && mkdir -p "$build_dir/bundle"
      tar -C "$build_dir/bundle" -xJf "$from" && cp "$from" "$build_dir/bundle/"
    fi
    from=$build_dir/bundle
  fi
  root=$(cd "$from/root" 2>/dev/null && pwd) || die "no bundle at $1 (make it with --make-bundle DIR)"
  lib=$root/usr/lib/x86_64-linux-gnu
  pc=$PWD/$build_dir/bundle-pkgconfig
  mkdir -p "$pc" "$PWD/$build_dir/bundle-lib"
  # pkg-config files say prefix=/usr: a copy says where the bundle is.
  for f in "$lib"/pkgconfig/*.pc "$root"/usr/share/pkgconfig/*.pc; do
    [ -e "$f" ] && sed -e "s|=/usr|=$root/usr|g" "$f" > "$pc/$(basename "$f")"
  done
  # The sonames the dynamic loader's cache lists with a file that is there.
  local system_libs
  system_libs=$({ ldconfig -p 2>/dev/null || /sbin/ldconfig -p; } | awk '$NF ~ /^\// {print $1, $NF}' |
                while read -r name path; do [ -e "$path" ] && echo "$name"; done | sort -u)
  for so in "$lib"/lib*.so.*; do
    local name
    name=$(basename "$so")
    grep -qxF "$name" <<<"$system_libs" || ln -sfn "$so" "$PWD/$build_dir/bundle-lib/$name"
  done
  run_lib_path=$PWD/$build_dir/bundle-lib
  export PATH="$root/usr/bin:$PATH"
  export CPATH="$root/usr/include/x86_64-linux-gnu:$root/usr/include${CPATH:+:$CPATH}"
  export PKG_CONFIG_PATH="$pc" PKG_CONFIG_LIBDIR="$pc"
  cmake_args+=(-DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_LIBRARY_ARCHITECTURE=x86_64-linux-gnu
               -DPKG_CONFIG_EXECUTABLE="$root/usr/bin/pkgconf"
               -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$lib" -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$lib")
}

with_lib_path() {
  LD_LIBRARY_PATH="$run_lib_path${run_lib_path:+${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH:-}" "$@"
}

# ---------------------------------------------------------------- which machine

if [ -z "$python" ]; then
  if [ -x /opt/torch/.venv/bin/python ]; then python=/opt/torch/.venv/bin/python; else python=$PWD/.venv/bin/python; fi
fi
[ -x "$python" ] || die "no python at $python (--python)"

gpus=0
command -v nvidia-smi >/dev/null && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "$build_only" = 1 ]; then
  device=none
elif [ "$force_cpu" = 1 ] || [ "$gpus" = 0 ]; then
  device=cpu
  say "no GPU: CPU dry run$([ "$force_cpu" = 1 ] && echo ' (--cpu)')"
else
  cuda=$("$python" -c 'import torch; print(torch.cuda.is_available())' 2>&1 | tail -1)
  # A GPU that this torch cannot use is a broken machine, not a CPU one: that fails.
  [ "$cuda" = True ] || die "nvidia-smi lists $gpus GPU(s) but $python's torch.cuda.is_available() says: $cuda"
  device=cuda:0
  say "GPU: $(nvidia-smi -L | head -1)"
fi

# ---------------------------------------------------------------- the binaries

if [ -n "$build" ]; then
  bin=$(cd "$build/bin" && pwd) || die "no $build/bin"
else
  [ -n "$bundle" ] && use_bundle "$bundle"
  generator=(-G "Unix Makefiles")
  command -v ninja >/dev/null && generator=(-G Ninja)
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  build_started=$(date +%s)
  mkdir -p "$build_dir"
  # Release and no tests: only the four programs, as fast as a 16-core machine builds them.
  # RECAL_VERSION: a copied tree may have no .git for `git describe`.
  with_lib_path cmake -S . -B "$build_dir" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DRECAL_BUILD_TESTS=OFF -DRECAL_PYTHON="$python" -DRECAL_VERSION=gpu-check "${cmake_args[@]}" >"$build_dir/gpu_check.configure.log" 2>&1 ||
    { tail -30 "$build_dir/gpu_check.configure.log"; die "configure failed (log: $build_dir/gpu_check.configure.log)"; }
  # shellcheck disable=SC2086  # a list of targets
  with_lib_path cmake --build "$build_dir" -j "$(nproc)" --target $targets \
    >"$build_dir/gpu_check.build.log" 2>&1 || { tail -30 "$build_dir/gpu_check.build.log"; die "build failed (log: $build_dir/gpu_check.build.log)"; }
  say "built $targets in $(( $(date +%s) - build_started )) s against $python"
  bin=$PWD/$build_dir/bin
  [ "$build_only" = 1 ] && exit 0
fi

# ---------------------------------------------------------------- the checks

status=0
with_lib_path "$python" scripts/gpu_check.py --bin "$bin" --device "$device" --started "$started" \
  --budget "$budget" "${passthrough[@]}" || status=$?
exit "$status"
