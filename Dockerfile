# syntax=docker/dockerfile:1
# recal-server (CPU, Debian's LibTorch). docker compose -f deploy/docker-compose.yml up
# builds and runs it; see the README, "Deployment with compose".

# ---- build: the same Debian packages as every other build (scripts/debian-packages.txt)
FROM debian:bookworm-slim AS build
WORKDIR /src
COPY scripts/debian-packages.txt scripts/install-deps.sh scripts/
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# Only the executables (and librecal_engine.so): the tests do not run in the image.
RUN --mount=type=cache,target=/root/.ccache \
    CCACHE_DIR=/root/.ccache cmake --preset default \
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
RUN ldconfig \
 && useradd --system --user-group --uid 10001 --home-dir /var/lib/recal --shell /usr/sbin/nologin recal \
 && mkdir -p /var/lib/recal /data \
 && chown recal:recal /var/lib/recal
USER recal
WORKDIR /var/lib/recal
VOLUME /var/lib/recal
# gRPC, Prometheus /metrics
EXPOSE 50051 9464
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD recalctl --server=localhost:50051 health
# Credentials are required: the auth file comes as a secret (compose: secrets.recal_auth).
ENTRYPOINT ["recal-server", "--data_dir=/var/lib/recal", "--data_root=/data", \
            "--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", "--auth_file=/run/secrets/recal_auth"]
