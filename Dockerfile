# recal-server (CPU, Debian's LibTorch). docker compose -f deploy/docker-compose.yml up
# builds and runs it (deploy/docker-compose.cluster.yml: the cluster); see the README,
# "Deployment with compose".

# ---- build: the shipped binaries only (-DRECAL_BUILD_TESTS=OFF), so only the packages of
# scripts/debian-packages-server.txt (no GoogleTest, Google Benchmark, python3-torch)
FROM debian:bookworm-slim AS build
WORKDIR /src
COPY scripts/debian-packages-server.txt scripts/install-deps.sh scripts/
RUN scripts/install-deps.sh scripts/debian-packages-server.txt && rm -rf /var/lib/apt/lists/*
COPY . .
# The tree has no .git (.dockerignore), so git describe cannot name the version: compose
# passes it (build arg RECAL_VERSION, default "dev"); recal_build_info{version} reports it.
ARG RECAL_VERSION=dev
# Release: no debug info in the image (RelWithDebInfo: 88 MB of binaries instead of 5 MB).
RUN --mount=type=cache,target=/root/.ccache \
    CCACHE_DIR=/root/.ccache cmake --preset default \
      -DRECAL_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release -DRECAL_VERSION="${RECAL_VERSION}" \
 && CCACHE_DIR=/root/.ccache cmake --build --preset default --target recal-server recal-worker recalctl -j "$(nproc)"

# ---- runtime: only the shared libraries' packages (deploy/runtime-packages.txt)
FROM debian:bookworm-slim AS runtime
COPY deploy/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      $(grep -v '^\s*#' /tmp/runtime-packages.txt | grep -v '^\s*$') \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt
COPY --from=build /src/build/lib/librecal_engine.so /usr/local/lib/
# recal-worker beside recal-server: every model runs in it, sandboxed.
COPY --from=build /src/build/bin/recal-server /src/build/bin/recal-worker /src/build/bin/recalctl /usr/local/bin/
# Execs recal-server (or, as the container's PID 1 without an init, stays its parent as a
# minimal init); RECAL_PGPASSWORD_FILE (a secret) becomes libpq's PGPASSWORD.
COPY deploy/recal-entrypoint.sh /usr/local/bin/recal-entrypoint
# uid and gid 10001 (Kubernetes' runAsUser/runAsGroup/fsGroup in deploy/k8s/).
# /var/lib/recal-shared: the cluster's shared blob volume (a fresh named volume takes the
# owner of the directory it is mounted on).
RUN ldconfig \
 && chmod 0755 /usr/local/bin/recal-entrypoint \
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
