# Two images from one build (README, "Deployment with compose"):
#   --target api     recal-server and recalctl only, no LibTorch: for --role=api (small)
#   --target worker  (the default, the last stage) the api image plus recal-worker, its
#                    librecal_engine.so and the torch wheel's libraries (CPU and CUDA): for
#                    --role=worker and the single process (--role=all)
# docker compose -f deploy/docker-compose.yml up builds and runs the worker image as one
# process; deploy/docker-compose.cluster.yml runs both (api-N: api, worker-N: worker).
# podman: build with --format docker, or the HEALTHCHECK is dropped (OCI has none).

# ---- build: the shipped binaries only (-DRECAL_BUILD_TESTS=OFF), so only the packages of
# scripts/debian-packages-server.txt (no GoogleTest, Google Benchmark, PostgreSQL server)
FROM debian:bookworm-slim AS build
WORKDIR /src
COPY scripts/debian-packages-server.txt scripts/install-deps.sh scripts/
RUN scripts/install-deps.sh scripts/debian-packages-server.txt && rm -rf /var/lib/apt/lists/*
# LibTorch is the torch wheel's (scripts/python-requirements.txt) in a venv at a fixed path:
# the binaries' RUNPATH names /opt/recal/venv/lib/python3.11/site-packages/torch/lib, and the
# worker stage puts the wheel's libraries at the same paths. Before `COPY . .`, so that a
# change to the sources does not download the wheel again.
COPY scripts/venv.sh scripts/python-requirements.txt scripts/
RUN --mount=type=cache,target=/root/.cache/pip RECAL_VENV=/opt/recal/venv scripts/venv.sh
COPY . .
# The tree has no .git (.dockerignore), so git describe cannot name the version: compose
# passes it (build arg RECAL_VERSION, default "dev"); recal_build_info{version} reports it.
ARG RECAL_VERSION=dev
# Release: no debug info in the image (RelWithDebInfo: 88 MB of binaries instead of 5 MB).
# No CUDA kernels of Recal's own (no CUDA toolkit here): on a GPU the image's workers take
# ATen's statistics kernels (docs/gpu.md).
RUN --mount=type=cache,target=/root/.ccache \
    CCACHE_DIR=/root/.ccache cmake --preset default -DRECAL_PYTHON=/opt/recal/venv/bin/python \
      -DRECAL_BUILD_TESTS=OFF -DRECAL_CUDA_KERNELS=OFF -DCMAKE_BUILD_TYPE=Release -DRECAL_VERSION="${RECAL_VERSION}" \
 && CCACHE_DIR=/root/.ccache cmake --build --preset default --target recal-server recal-worker recalctl -j "$(nproc)"
# What the worker stage copies of the wheel is its shared libraries only. Left out here: torch's
# Python parts in torch/lib (libtorch_python.so, libshm.so and its headers,
# libtorch_global_deps.so: only `import torch` loads them; 33 MB) and the static and device-code
# archives in nvidia/*/lib (*.a, *.bc: for linking CUDA code, never loaded; 36 MB). Everything
# else of the venv (Python, torch's and the nvidia packages' Python modules and headers,
# torchvision, numpy) stays here: the worker stage copies lib directories only.
RUN cd /opt/recal/venv/lib/python3.11/site-packages \
 && rm -rf torch/lib/libtorch_python.so torch/lib/libshm.so torch/lib/libshm torch/lib/libshm_windows \
      torch/lib/libtorch_global_deps.so nvidia/*/lib/*.a nvidia/*/lib/*.bc

# ---- api: recal-server and recalctl with the Debian libraries they link
# (deploy/runtime-packages.txt); no LibTorch.
FROM debian:bookworm-slim AS api
COPY deploy/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      $(grep -v '^\s*#' /tmp/runtime-packages.txt | grep -v '^\s*$') \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt
COPY --from=build /src/build/bin/recal-server /src/build/bin/recalctl /usr/local/bin/
# Execs recal-server (or, as the container's PID 1 without an init, stays its parent as a
# minimal init); RECAL_PGPASSWORD_FILE (a secret) becomes libpq's PGPASSWORD.
COPY deploy/recal-entrypoint.sh /usr/local/bin/recal-entrypoint
# uid and gid 10001 (Kubernetes' runAsUser/runAsGroup/fsGroup in deploy/k8s/).
# /var/lib/recal-shared: the cluster's shared blob volume (a fresh named volume takes the
# owner of the directory it is mounted on).
RUN chmod 0755 /usr/local/bin/recal-entrypoint \
 && groupadd --system --gid 10001 recal \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/recal --shell /usr/sbin/nologin recal \
 && mkdir -p /var/lib/recal /var/lib/recal-shared /data \
 && chown recal:recal /var/lib/recal /var/lib/recal-shared
USER recal
WORKDIR /var/lib/recal
VOLUME /var/lib/recal
# gRPC, Prometheus /metrics
EXPOSE 50051 9464
# The address the health check asks: set it with another --listen (shell form, so the
# variable is read when the check runs).
ENV RECAL_HEALTH_ADDRESS=localhost:50051
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD recalctl --server="$RECAL_HEALTH_ADDRESS" health || exit 1
# Credentials are required: the auth file comes as a secret (compose: secrets.recal_auth).
# Arguments given to the container (compose `command:`, Kubernetes `args:`) come after these;
# for every flag but --data_root (which adds a root) the last occurrence wins.
ENTRYPOINT ["recal-entrypoint", "--data_dir=/var/lib/recal", "--data_root=/data", \
            "--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", "--auth_file=/run/secrets/recal_auth"]

# ---- worker: the api image (its user, entrypoint, health check and volumes) plus what runs
# models: recal-worker beside recal-server (every model runs in it, sandboxed),
# librecal_engine.so, the Debian libraries only they link (deploy/runtime-packages-worker.txt)
# and the torch wheel's libraries at the build stage's paths, where the binaries' RUNPATH and
# libtorch_cpu.so's own RPATH ($ORIGIN/../../nvidia/*/lib) find them. CUDA-capable: on a host
# with an NVIDIA driver and its container toolkit (libcuda.so.1 comes from the driver) the same
# image serves GPUs (README, "GPU image").
FROM api AS worker
USER root
COPY deploy/runtime-packages-worker.txt /tmp/runtime-packages-worker.txt
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      $(grep -v '^\s*#' /tmp/runtime-packages-worker.txt | grep -v '^\s*$') \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages-worker.txt
COPY --from=build /opt/recal/venv/lib/python3.11/site-packages/torch/lib/ /opt/recal/venv/lib/python3.11/site-packages/torch/lib/
COPY --from=build /opt/recal/venv/lib/python3.11/site-packages/nvidia/cu13/lib/ /opt/recal/venv/lib/python3.11/site-packages/nvidia/cu13/lib/
COPY --from=build /opt/recal/venv/lib/python3.11/site-packages/nvidia/cudnn/lib/ /opt/recal/venv/lib/python3.11/site-packages/nvidia/cudnn/lib/
COPY --from=build /opt/recal/venv/lib/python3.11/site-packages/nvidia/cusparselt/lib/ /opt/recal/venv/lib/python3.11/site-packages/nvidia/cusparselt/lib/
COPY --from=build /opt/recal/venv/lib/python3.11/site-packages/nvidia/nccl/lib/ /opt/recal/venv/lib/python3.11/site-packages/nvidia/nccl/lib/
COPY --from=build /opt/recal/venv/lib/python3.11/site-packages/nvidia/nvshmem/lib/ /opt/recal/venv/lib/python3.11/site-packages/nvidia/nvshmem/lib/
COPY --from=build /src/build/lib/librecal_engine.so /usr/local/lib/
COPY --from=build /src/build/bin/recal-worker /usr/local/bin/
RUN ldconfig
USER recal
