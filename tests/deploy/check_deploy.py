#!/usr/bin/env python3
"""Checks the deployment files without a Docker engine or a Kubernetes cluster (issues 6, 13).

  (a) deploy/docker-compose.yml, deploy/prometheus.yml and the Grafana provisioning parse
      and say what they must; every dashboard query names a Recal metric;
      deploy/docker-compose.cluster.yml and deploy/prometheus.cluster.yml: PostgreSQL, two
      api and two worker processes on one store and one blob volume, scraped by Prometheus;
  (b) promtool check config on both Prometheus files, if /usr/bin/promtool exists;
  (c) the Dockerfile's build stage installs scripts/debian-packages-server.txt through
      scripts/install-deps.sh, makes the torch wheel's venv at a fixed path and builds
      against it without the tests; its stage api (recal-server, recalctl, no LibTorch)
      installs exactly deploy/runtime-packages.txt, its stage worker (built on api: the
      default target) adds exactly deploy/runtime-packages-worker.txt, recal-worker,
      librecal_engine.so and the wheel's torch/lib and nvidia/*/lib at the build stage's
      paths; the entrypoint script, run with a stub server (also as PID 1 of a PID
      namespace, where unshare can make one);
  (d) every library the api binaries (--api-binary) load (ldd) belongs to a package of
      deploy/runtime-packages.txt or to one of their (recursive) Depends, and none is
      LibTorch's or CUDA's; every library the worker image's binaries load belongs to one of
      both lists' packages or their Depends, or lies in a wheel directory the worker stage
      copies, every nvidia/*/lib is copied (LibTorch loads some late), and what the copied
      libraries link is there too;
  (e) deploy/k8s/: the manifests and the GPU overlay agree with the server, each other and
      the pod security the sandbox can live with;
  (f) the build stage's list: a subset of scripts/debian-packages.txt, and CMake configures
      with -DRECAL_BUILD_TESTS=OFF without GoogleTest or Google Benchmark, every file it
      finds coming from the list's packages or their Depends;
  (g) recal-server --role=api starts and answers an upload without recal-worker, which
      the api image does not hold (UNAVAILABLE naming what to start: no worker process is
      up to inspect it), and refuses to start without --internal_token_file, saying so.

Every recal command line (compose: the image's ENTRYPOINT + command; Kubernetes: command
+ args) may use only the flags `recal-server --helpfull` lists; --role=api runs the api
image, every other role the worker image (compose: build target and image name;
Kubernetes: image name), and every api replica gets the cluster secret (--internal_token_file
from a secret), which it needs to have the workers inspect its uploads.

usage: check_deploy.py --source DIR [--server RECAL_SERVER] [--api-binary BINARY]... BINARY...
"""
import argparse
import copy
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

import yaml

METRICS = {
    "recal_jobs_queued", "recal_jobs_running", "recal_job_duration_seconds",
    "recal_samples_processed_total", "recal_jobs_finished_total", "grpc_server_handled_total",
}
SHUTDOWN_TIMEOUT_S = 20  # recal-server --shutdown_timeout_seconds default
# The project's own shared libraries (the CUDA kernels' where the build had nvcc).
OWN_LIBS = {"librecal_engine.so", "librecal_engine_cuda_kernels.so"}
# A sanitizer build (scripts/sanitize.sh) links GCC's sanitizer runtimes, which no image ships.
SANITIZER_RUNTIMES = re.compile(r"^lib(asan|ubsan|tsan|lsan)\.so")
# Packages only the tests and benchmarks need: never in the image's build stage.
TEST_ONLY_PKGS = {"libgtest-dev", "libgmock-dev", "libbenchmark-dev", "python3-torch",
                  "python3-torchvision", "postgresql"}
# What may start recal-server in a container: itself, or the image's entrypoint script
# (deploy/recal-entrypoint.sh, which execs it with the same arguments).
SERVER_PROGRAMS = {"recal-server", "recal-entrypoint", "/usr/local/bin/recal-server",
                   "/usr/local/bin/recal-entrypoint"}

failures = []
notes = []
SERVER_FLAGS = set()  # filled in main() from recal-server --helpfull


def check(cond, what):
    print(("  ok   " if cond else "  FAIL ") + what)
    if not cond:
        failures.append(what)
    return cond


def read_list(path):
    with open(path) as f:
        return [l.strip() for l in f if l.strip() and not l.strip().startswith("#")]


def load_yaml(path):
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        check(False, f"{path} parses: {e}")
        return None
    check(isinstance(doc, dict), f"{os.path.relpath(path)} parses as a YAML mapping")
    return doc if isinstance(doc, dict) else None


def seconds(duration):
    """Compose durations: 30s, 1m30s, 1h, 500ms, or a bare number of seconds."""
    if isinstance(duration, (int, float)):
        return float(duration)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", str(duration))
    if not parts or "".join(n + u for n, u in parts) != str(duration).strip():
        return None
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * scale[u] for n, u in parts)


def interpolate(value):
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default} with this environment."""
    def sub(m):
        name, op, default = m.group(1), m.group(2), m.group(3) or ""
        v = os.environ.get(name)
        if op == ":-" and not v or op == "-" and v is None:
            return default
        return v or ""
    return re.sub(r"\$\{(\w+)(?:(:?-)([^}]*))?\}", sub, value)


def load_yaml_docs(path):
    """Every document of a multi-document YAML file (None ones dropped), or None."""
    try:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        check(False, f"{path} parses: {e}")
        return None
    ok = all(isinstance(d, (dict, list)) for d in docs) and docs
    check(bool(ok), f"{os.path.relpath(path)} parses ({len(docs)} document(s))")
    return docs if ok else None


# ------------------------------------------------------------------ recal-server's flags
def server_flags(binary):
    """The flag names `recal-server --helpfull` lists (`  --name=default`, then its help)."""
    r = subprocess.run([binary, "--helpfull"], capture_output=True, text=True, timeout=60)
    names = set(re.findall(r"^\s+--([A-Za-z_][A-Za-z0-9_]*)[=\s]", r.stdout + r.stderr, re.M))
    check({"listen", "metrics_listen", "role", "store", "blobs", "auth_file", "data_root"} <= names,
          f"recal-server --helpfull lists its flags ({len(names)})")
    return names


FLAG_RE = re.compile(r"--([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?", re.S)


def flags_of(argv):
    """[(name, value)] of the --name[=value] arguments of argv[1:], unchecked."""
    return [m.groups() for m in map(FLAG_RE.fullmatch, argv[1:]) if m]


def parse_flags(argv, where):
    """[(name, value)] of argv[1:], every argument --name or --name=value; checks the names."""
    flags, bad, unknown = [], [], []
    for a in argv[1:]:
        m = FLAG_RE.fullmatch(a)
        if not m:
            bad.append(a)
            continue
        name, value = m.group(1), m.group(2)
        flags.append((name, value))
        if SERVER_FLAGS and name not in SERVER_FLAGS and not (
                name.startswith("no") and name[2:] in SERVER_FLAGS):
            unknown.append(name)
    check(not bad, f"{where}: every argument is --flag[=value] ({bad})")
    check(not unknown, f"{where}: every flag is one recal-server has ({unknown})")
    return flags


def last(flags, name, default=None):
    """absl: of a flag given twice the last counts (--data_root excepted: it adds roots)."""
    values = [v for n, v in flags if n == name]
    return values[-1] if values else default


def port_of(address):
    m = re.search(r":(\d+)$", address or "")
    return int(m.group(1)) if m else None


def check_metrics_scrapable(flags, where):
    """recal-server's --metrics_listen defaults to loopback (127.0.0.1:9464), which a Prometheus
    in another container or pod cannot reach: every deployed recal process names its address,
    beyond loopback, on its command line."""
    address = last(flags, "metrics_listen")
    host = (address or "").rpartition(":")[0]
    check(address is not None and port_of(address) is not None
          and not (host.startswith("127.") or host in ("localhost", "[::1]", "")),
          f"{where}: --metrics_listen={address} given, beyond loopback (the default is 127.0.0.1:9464)")


def check_store_uri(uri, where):
    """A libpq URI with neither a password in the user-info nor in the query."""
    ok = isinstance(uri, str) and uri.startswith("postgresql://")
    check(ok, f"{where}: --store is a postgresql:// URI ({uri})")
    if not ok:
        return None
    parts = urllib.parse.urlsplit(uri)
    query = urllib.parse.parse_qs(parts.query)
    check(parts.password is None and "password" not in query,
          f"{where}: --store carries no password (PGPASSWORD comes from a secret)")
    return parts


def check_no_password_in_argv(argv, where):
    leaked = [a for a in argv if re.search(r"pass(word)?=|PGPASSWORD", a, re.I)
              or re.match(r"--store=\w+://[^/@]*:[^/@]*@", a)]
    check(not leaked, f"{where}: no password on the command line ({leaked})")


# --------------------------------------------------------------------------- (a)
def compose_dockerfile(deploy, svc):
    build = svc.get("build")
    if isinstance(build, dict):
        return os.path.normpath(os.path.join(
            deploy, build.get("context", "."), build.get("dockerfile", "Dockerfile")))
    if isinstance(build, str):
        return os.path.normpath(os.path.join(deploy, build, "Dockerfile"))
    return None


def image_for(role):
    """The Dockerfile target a process of this role runs: --role=api starts no recal-worker
    (the workers inspect its uploads; check (g) runs it without one), so it runs the api image
    (no recal-worker, no LibTorch); every other role runs models, in the worker image."""
    return API_STAGE if role == "api" else WORKER_STAGE


def check_compose_image(svc, role, where):
    """A recal service builds the target its --role needs and tags it with that target's name."""
    build = svc.get("build") if isinstance(svc.get("build"), dict) else {}
    target = image_for(role)
    want = f"{IMAGE_NAMES[target]}:latest"
    check(build.get("target") == target and str(svc.get("image")) == want,
          f"{where} (--role={role}): target {target}, image {want} ({build.get('target')}, {svc.get('image')})")


def compose_mounts(svc):
    """{target: (kind, source, read_only)}"""
    mounts = {}
    for v in svc.get("volumes") or []:
        if isinstance(v, str):
            fields = interpolate(v).split(":")
            # SOURCE:TARGET[:MODE]; a bare TARGET is an anonymous volume
            src, target = (fields[0], fields[1]) if len(fields) >= 2 else (None, fields[0])
            ro = len(fields) >= 3 and "ro" in fields[2].split(",")
            kind = "volume" if src and re.fullmatch(r"[A-Za-z0-9][\w.-]*", src) else "bind"
        else:
            src, target = v.get("source"), v.get("target")
            ro, kind = bool(v.get("read_only")), v.get("type", "volume")
        mounts[target] = (kind, src, ro)
    return mounts


def compose_secrets(svc):
    """{target path: secret name} of the secrets a service gets."""
    out = {}
    for sec in svc.get("secrets") or []:
        name = sec if isinstance(sec, str) else sec.get("source")
        target = None if isinstance(sec, str) else sec.get("target")
        if not target:
            target = name
        if name:
            out[target if target.startswith("/") else "/run/secrets/" + target] = name
    return out


def compose_env(svc):
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
    return {k: (interpolate(str(v)) if v is not None else None) for k, v in env.items()}


def compose_ports(svc):
    """[(published, target)] as strings (published None when not published on a fixed port)."""
    out = []
    for p in svc.get("ports") or []:
        if isinstance(p, dict):
            out.append((str(p.get("published")) if p.get("published") else None, str(p.get("target"))))
            continue
        fields = interpolate(str(p)).split("/")[0].split(":")
        out.append((fields[-2] if len(fields) >= 2 else None, fields[-1]))
    return out


def compose_argv(svc, image):
    """What the container runs: entrypoint (the service's or the image's) + command."""
    def words(v):
        if v is None:
            return None
        return [interpolate(str(w)) for w in v] if isinstance(v, list) else shlex.split(interpolate(str(v)))
    entry = words(svc.get("entrypoint"))
    command = words(svc.get("command"))
    return (entry if entry is not None else list(image["entrypoint"])) + (command or [])


def check_health_address(env, image, listen_port, where):
    """The image's HEALTHCHECK asks $RECAL_HEALTH_ADDRESS: it must name the --listen port."""
    address = env.get("RECAL_HEALTH_ADDRESS", image["env"].get("RECAL_HEALTH_ADDRESS"))
    check(address is not None and port_of(address) == listen_port,
          f"{where}: the health check asks {address}, the --listen port is {listen_port}")


def check_compose(deploy, image):
    print("(a) docker-compose.yml")
    doc = load_yaml(os.path.join(deploy, "docker-compose.yml"))
    if doc is None:
        return
    services = doc.get("services") or {}
    for s in ("recal", "prometheus", "grafana"):
        check(s in services, f"service {s}")
    recal = services.get("recal") or {}
    dockerfile = compose_dockerfile(deploy, recal)
    check(dockerfile is not None and os.path.isfile(dockerfile),
          f"recal builds from an existing Dockerfile ({dockerfile})")
    build_args = (recal.get("build") or {}).get("args") or {} if isinstance(recal.get("build"), dict) else {}
    check("RECAL_VERSION" in build_args, "recal passes the build arg RECAL_VERSION")

    grace = seconds(recal.get("stop_grace_period", "10s"))
    check(grace is not None and grace > SHUTDOWN_TIMEOUT_S,
          f"recal stop_grace_period {recal.get('stop_grace_period')} > "
          f"--shutdown_timeout_seconds {SHUTDOWN_TIMEOUT_S}s")

    mounts = compose_mounts(recal)
    data_dir = mounts.get("/var/lib/recal")
    check(data_dir is not None and data_dir[0] == "volume" and data_dir[1] in (doc.get("volumes") or {}),
          f"named volume at /var/lib/recal ({data_dir})")
    data = mounts.get("/data")
    check(data is not None and data[0] == "bind" and data[2],
          f"read-only bind mount at /data ({data})")

    # The server listens beyond loopback, so it must get its credentials: the secret the
    # Dockerfile's --auth_file=/run/secrets/recal_auth reads.
    secrets = compose_secrets(recal)
    check("recal_auth" in secrets.values() and "recal_auth" in (doc.get("secrets") or {}),
          f"recal gets the secret recal_auth ({sorted(secrets.values())})")
    argv = compose_argv(recal, image)
    flags = parse_flags(argv, "recal")
    check_compose_image(recal, last(flags, "role", "all"), "recal")
    check(last(flags, "auth_file") in secrets, f"recal: --auth_file={last(flags, 'auth_file')} is a secret it gets")
    check_metrics_scrapable(flags, "recal")
    listen, metrics = port_of(last(flags, "listen")), port_of(last(flags, "metrics_listen"))
    ports = {t for _, t in compose_ports(recal)}
    check({str(listen), str(metrics)} <= ports and {"50051", "9464"} <= ports,
          f"recal publishes 50051 and 9464, its --listen and --metrics_listen ports ({sorted(ports)})")
    check_health_address(compose_env(recal), image, listen, "recal")

    prom = services.get("prometheus") or {}
    check(str(prom.get("image", "")).startswith("prom/prometheus"), "prometheus image prom/prometheus")
    check(any("prometheus.yml:/etc/prometheus/prometheus.yml" in str(v) for v in prom.get("volumes") or []),
          "prometheus mounts deploy/prometheus.yml")
    graf = services.get("grafana") or {}
    check(str(graf.get("image", "")).startswith("grafana/grafana"), "grafana image grafana/grafana")
    check(any(str(v).startswith("./grafana/provisioning:/etc/grafana/provisioning")
              for v in graf.get("volumes") or []), "grafana mounts deploy/grafana/provisioning")


def check_cluster_compose(deploy, image):
    print("(a) docker-compose.cluster.yml")
    doc = load_yaml(os.path.join(deploy, "docker-compose.cluster.yml"))
    if doc is None:
        return {}
    services = doc.get("services") or {}
    top_secrets = doc.get("secrets") or {}
    top_volumes = doc.get("volumes") or {}
    for name, sec in top_secrets.items():
        check(isinstance(sec, dict) and ("file" in sec or "environment" in sec),
              f"secret {name} comes from a file (or the environment), not a literal")

    # PostgreSQL 15: a named volume, pg_isready, its password from a secret file.
    pg = services.get("postgres") or {}
    check(str(pg.get("image")) == "postgres:15", f"postgres image postgres:15 ({pg.get('image')})")
    pg_data = compose_mounts(pg).get("/var/lib/postgresql/data")
    check(pg_data is not None and pg_data[0] == "volume" and pg_data[1] in top_volumes,
          f"postgres keeps its data in a named volume ({pg_data})")
    test = (pg.get("healthcheck") or {}).get("test")
    check("pg_isready" in (" ".join(test) if isinstance(test, list) else str(test)),
          f"postgres healthcheck runs pg_isready ({test})")
    pg_env, pg_secrets = compose_env(pg), compose_secrets(pg)
    check("POSTGRES_PASSWORD" not in pg_env, "postgres: no POSTGRES_PASSWORD in its environment")
    pg_password_secret = pg_secrets.get(pg_env.get("POSTGRES_PASSWORD_FILE"))
    check(pg_password_secret in top_secrets,
          f"postgres: POSTGRES_PASSWORD_FILE={pg_env.get('POSTGRES_PASSWORD_FILE')} is a secret it gets")
    pg_user, pg_db = pg_env.get("POSTGRES_USER", "postgres"), pg_env.get("POSTGRES_DB")

    recal = {n: s for n, s in services.items() if str(s.get("image", "")).startswith("recal-server")}
    check(len(recal) == 4, f"four recal services ({sorted(recal)})")
    roles, stores, blobs, targets = {}, set(), set(), {}
    blob_volumes, relay_secrets = set(), set()
    for name, svc in sorted(recal.items()):
        dockerfile = compose_dockerfile(deploy, svc)
        check(dockerfile is not None and os.path.isfile(dockerfile)
              and "RECAL_VERSION" in ((svc.get("build") or {}).get("args") or {}),
              f"{name}: built from {dockerfile} with RECAL_VERSION")
        argv = compose_argv(svc, image)
        check(argv[:1] and argv[0] in SERVER_PROGRAMS, f"{name}: runs recal-server ({argv[:1]})")
        flags = parse_flags(argv, name)
        check_no_password_in_argv(argv, name)
        roles[name] = last(flags, "role", "all")
        check_compose_image(svc, roles[name], name)
        store, blob = last(flags, "store"), last(flags, "blobs")
        stores.add(store)
        blobs.add(blob)
        parts = check_store_uri(store, name)
        if parts:
            check(parts.hostname in services and parts.hostname == "postgres"
                  and parts.username == pg_user and parts.path.lstrip("/") == pg_db,
                  f"{name}: --store names the postgres service, its user and database ({store})")
        mounts = compose_mounts(svc)
        blob_dir = (blob or "").partition("file:")[2]
        m = mounts.get(blob_dir)
        check(m is not None and m[0] == "volume" and m[1] in top_volumes and not m[2],
              f"{name}: --blobs={blob} is a writable named volume ({m})")
        if m:
            blob_volumes.add(m[1])
        data = mounts.get("/data")
        check(data is not None and data[0] == "bind" and data[2], f"{name}: read-only /data ({data})")
        data_roots = [v for n, v in flags if n == "data_root"]
        check(data_roots and all(r.split("=")[-1] in mounts for r in ",".join(data_roots).split(",")),
              f"{name}: every --data_root is a mount ({data_roots})")
        secrets, env = compose_secrets(svc), compose_env(svc)
        check(secrets.get(last(flags, "auth_file")) in top_secrets,
              f"{name}: --auth_file={last(flags, 'auth_file')} is a secret it gets")
        # Client streams in cluster mode: api replicas relay pushed batches to the worker
        # running the job, admitted by the cluster secret (README, "Cluster mode").
        relay_secret = secrets.get(last(flags, "internal_token_file"))
        check(relay_secret in top_secrets and relay_secret not in (pg_password_secret, secrets.get(last(flags, "auth_file"))),
              f"{name}: --internal_token_file={last(flags, 'internal_token_file')} is a secret of its own it gets")
        relay_secrets.add(relay_secret)
        if roles[name] == "api":
            check(bool(last(flags, "internal_token_file")) and relay_secret in top_secrets,
                  f"{name}: --role=api gets the cluster secret it needs (the workers inspect its uploads)")
        check(secrets.get(env.get("RECAL_PGPASSWORD_FILE")) == pg_password_secret and pg_password_secret,
              f"{name}: RECAL_PGPASSWORD_FILE={env.get('RECAL_PGPASSWORD_FILE')} is postgres's password "
              f"secret {pg_password_secret}")
        literal = [k for k, v in env.items() if re.search("PASSWORD", k) and not k.endswith("_FILE")]
        check(not literal, f"{name}: no password in its environment ({literal})")
        dep = svc.get("depends_on") or {}
        check(isinstance(dep, dict) and (dep.get("postgres") or {}).get("condition") == "service_healthy",
              f"{name}: starts once postgres is healthy")
        grace = seconds(svc.get("stop_grace_period", "10s"))
        check(grace is not None and grace > SHUTDOWN_TIMEOUT_S,
              f"{name}: stop_grace_period {svc.get('stop_grace_period')} > {SHUTDOWN_TIMEOUT_S}s")
        check_metrics_scrapable(flags, name)
        listen, metrics = port_of(last(flags, "listen")), port_of(last(flags, "metrics_listen"))
        check(listen is not None and metrics is not None and not last(flags, "listen", "").startswith("127."),
              f"{name}: --listen and --metrics_listen beyond loopback ({listen}, {metrics})")
        check_health_address(env, image, listen, name)
        published = compose_ports(svc)
        if roles[name] == "api":
            check(published and all(t == str(listen) for _, t in published),
                  f"{name}: publishes its --listen port {listen} ({published})")
        else:
            internal = last(flags, "internal_listen", "0.0.0.0:50052")
            port = port_of(internal)
            advertised = last(flags, "advertise_address", "")
            check(port and port not in (listen, metrics) and not internal.startswith("127."),
                  f"{name}: --internal_listen={internal} beyond loopback, a port of its own")
            check(advertised == f"{name}:{port}",
                  f"{name}: --advertise_address={advertised} is its service name and --internal_listen port")
            check(not published, f"{name}: publishes nothing, its internal endpoint included ({published})")
        targets[name] = metrics
    check(sorted(roles.values()) == ["api", "api", "worker", "worker"], f"roles: two api, two worker ({roles})")
    check(len(stores) == 1, f"one --store for all ({sorted(map(str, stores))})")
    check(len(relay_secrets) == 1, f"one cluster secret for all ({sorted(map(str, relay_secrets))})")
    check(len(blobs) == 1 and len(blob_volumes) == 1, f"one --blobs on one volume for all ({sorted(map(str, blobs))})")
    api_ports = sorted(p for n in recal if roles[n] == "api" for p, _ in compose_ports(recal[n]))
    check(api_ports == ["50051", "50052"], f"api replicas published on 50051 and 50052 ({api_ports})")
    prom = services.get("prometheus") or {}
    check(any("prometheus.cluster.yml:/etc/prometheus/prometheus.yml" in str(v) for v in prom.get("volumes") or []),
          "prometheus mounts deploy/prometheus.cluster.yml")
    return {f"{name}:{port}" for name, port in targets.items()}


def check_prometheus(deploy):
    print("(a) prometheus.yml")
    doc = load_yaml(os.path.join(deploy, "prometheus.yml"))
    if doc is None:
        return
    global_interval = (doc.get("global") or {}).get("scrape_interval", "1m")
    found = None
    for job in doc.get("scrape_configs") or []:
        for sc in job.get("static_configs") or []:
            if "recal:9464" in (sc.get("targets") or []):
                found = job
    check(found is not None, "a scrape job targets recal:9464")
    if found:
        check(found.get("metrics_path", "/metrics") == "/metrics", "metrics_path /metrics")
        check(seconds(found.get("scrape_interval", global_interval)) == 15, "scrape interval 15s")


def check_prometheus_cluster(deploy, expected):
    print("(a) prometheus.cluster.yml")
    doc = load_yaml(os.path.join(deploy, "prometheus.cluster.yml"))
    if doc is None:
        return
    global_interval = (doc.get("global") or {}).get("scrape_interval", "1m")
    targets, paths = set(), set()
    for job in doc.get("scrape_configs") or []:
        found = set()
        for sc in job.get("static_configs") or []:
            found |= set(sc.get("targets") or []) & expected
        if found:
            targets |= found
            paths.add(job.get("metrics_path", "/metrics"))
            check(seconds(job.get("scrape_interval", global_interval)) == 15,
                  f"job {job.get('job_name')}: scrape interval 15s")
    check(expected and targets == expected,
          f"every recal process's --metrics_listen is a target (missing: {sorted(expected - targets)})")
    check(paths == {"/metrics"}, f"metrics_path /metrics ({sorted(paths)})")


def promql_metrics(expr):
    """The metric names an expression selects (labels, strings, ranges, functions removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or aggregation
        if m.group(0) in ("and", "or", "unless", "offset", "bool", "inf", "nan", "le"):
            continue
        names.add(m.group(0))
    return names


def base_metric(name):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in METRICS:
            return name[: -len(suffix)]
    return name


def check_grafana(deploy):
    print("(a) Grafana provisioning")
    prov = os.path.join(deploy, "grafana", "provisioning")
    ds = load_yaml(os.path.join(prov, "datasources", "prometheus.yml"))
    if ds:
        srcs = ds.get("datasources") or []
        check(any(s.get("type") == "prometheus" and s.get("url") == "http://prometheus:9090"
                  for s in srcs), "datasource: prometheus at http://prometheus:9090")
    dbs = load_yaml(os.path.join(prov, "dashboards", "dashboards.yml"))
    if dbs:
        paths = [(p.get("options") or {}).get("path") for p in dbs.get("providers") or []]
        check("/etc/grafana/provisioning/dashboards" in paths,
              f"dashboard provider reads /etc/grafana/provisioning/dashboards ({paths})")
    path = os.path.join(prov, "dashboards", "recal.json")
    try:
        with open(path) as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        check(False, f"recal.json parses: {e}")
        return
    check(True, "recal.json parses")

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels") or [])

    seen = set()
    ok = True
    all_panels = list(panels(dash.get("panels") or []))
    for p in all_panels:
        for t in p.get("targets") or []:
            names = promql_metrics(t.get("expr", ""))
            bases = {base_metric(n) for n in names}
            unknown = bases - METRICS
            if not names or unknown:
                ok = check(False, f"panel {p.get('title')!r}: {t.get('expr')!r} names "
                                  f"{sorted(unknown) or 'no metric'}") and ok
            seen |= bases & METRICS
    check(ok and all_panels, f"{len(all_panels)} panels, every expr names a Recal metric")
    check(seen == METRICS, f"the dashboard shows every metric (missing: {sorted(METRICS - seen)})")
    exprs = " ".join(t.get("expr", "") for p in all_panels for t in p.get("targets") or [])
    check("histogram_quantile" in exprs and "recal_job_duration_seconds_bucket" in exprs,
          "job duration as histogram_quantile over recal_job_duration_seconds_bucket")
    check('state="FAILED"' in exprs and 'grpc_code!="OK"' in exprs,
          'errors: FAILED jobs and grpc_code!="OK"')


# --------------------------------------------------------------------------- (b)
def check_promtool(deploy):
    print("(b) promtool")
    promtool = "/usr/bin/promtool"
    if not os.access(promtool, os.X_OK):
        print(f"  skip {promtool} not installed (Debian package 'prometheus'): "
              "the Prometheus files checked structurally only")
        notes.append("promtool skipped")
        return
    for name in ("prometheus.yml", "prometheus.cluster.yml"):
        r = subprocess.run([promtool, "check", "config", os.path.join(deploy, name)],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"promtool check config deploy/{name}" +
              ("" if r.returncode == 0 else ":\n" + r.stdout + r.stderr))


# --------------------------------------------------------------------------- (c)
def dockerfile_stages(text):
    """[(name, [instruction lines])], continuation lines joined, comments dropped."""
    lines, cur = [], ""
    for raw in text.splitlines():
        s = raw.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if s.startswith("#"):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        lines.append(cur + s)
        cur = ""
    if cur:
        lines.append(cur)
    stages = []
    for l in lines:
        m = re.match(r"FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", l, re.I)
        if m:
            stages.append((m.group(2) or m.group(1), m.group(1), []))
        elif stages:
            stages[-1][2].append(l)
    return stages


# The Dockerfile's stages: what each image is for.
BUILD_STAGE, API_STAGE, WORKER_STAGE = "build", "api", "worker"
# Image names, one per target, the same in compose and Kubernetes.
IMAGE_NAMES = {API_STAGE: "recal-server-api", WORKER_STAGE: "recal-server"}
# The torch wheel's library directories, relative to its site-packages.
WHEEL_LIB_DIR = re.compile(r"^(torch/lib|nvidia/[^/]+/lib)$")


def stage_lines(stages, name):
    """The instructions an image of stage `name` holds: its own after those of the stages it is
    built FROM (FROM api AS worker inherits api's user, entrypoint and health check)."""
    by_name = {n: (base, lines) for n, base, lines in stages}
    out, seen = [], set()
    while name in by_name and name not in seen:
        seen.add(name)
        base, lines = by_name[name]
        out = lines + out
        name = base
    return out


def image_of(lines):
    """ENTRYPOINT and ENV of an image's instructions (the last ENTRYPOINT counts)."""
    env, entry = {}, []
    for l in lines:
        if l.startswith("ENV "):
            words = shlex.split(l[4:])
            if words and "=" not in words[0]:
                env[words[0]] = " ".join(words[1:])  # ENV KEY VALUE
            else:
                env.update(w.split("=", 1) for w in words if "=" in w)
    ep = [l for l in lines if l.startswith("ENTRYPOINT")]
    try:
        entry = json.loads(ep[-1][len("ENTRYPOINT"):]) if ep else []
    except ValueError:
        check(False, f"ENTRYPOINT is a JSON list ({ep[-1]})")
    return entry, env


def image_info(source):
    """What the images run: the worker image's (the last stage's) ENTRYPOINT and ENV, which
    the api image shares (check_dockerfile checks that), and the parsed stages."""
    info = {"text": "", "stages": [], "entrypoint": [], "env": {}}
    try:
        info["text"] = open(os.path.join(source, "Dockerfile")).read()
    except OSError as e:
        check(False, f"Dockerfile: {e}")
        return info
    info["stages"] = dockerfile_stages(info["text"])
    if info["stages"]:
        info["entrypoint"], info["env"] = image_of(stage_lines(info["stages"], info["stages"][-1][0]))
    return info


def copies(lines):
    """[(sources, dest)] of the COPY --from=<stage> instructions."""
    out = []
    for l in lines:
        if not re.match(r"COPY\s+--from=", l):
            continue
        words = [w for w in l.split()[1:] if not w.startswith("--")]
        if len(words) >= 2:
            out.append((words[:-1], words[-1]))
    return out


def copied_names(lines):
    return {os.path.basename(src.rstrip("/")) for srcs, _ in copies(lines) for src in srcs}


def build_venv(build_text):
    """The venv the build stage makes (RECAL_VENV=... scripts/venv.sh), or None."""
    m = re.search(r"^RUN\s.*\bRECAL_VENV=(\S+)\s+(\./)?scripts/venv\.sh\b", build_text, re.M)
    return m.group(1).rstrip("/") if m else None


def wheel_copies(lines, venv):
    """{directory relative to the venv} the stage copies from the build stage's venv to the same
    path, and [instructions] that copy any other way."""
    same, other = set(), []
    for srcs, dest in copies(lines):
        for src in srcs:
            if not venv or not src.startswith(venv + "/"):
                continue
            if src.rstrip("/") == dest.rstrip("/"):
                same.add(os.path.relpath(src.rstrip("/"), venv))
            else:
                other.append(f"{src} -> {dest}")
    return same, other


def check_dockerfile(source, runtime_pkgs, worker_pkgs, image, shared_dirs):
    print("(c) Dockerfile")
    text, stages = image["text"], image["stages"]
    if not text:
        return
    # A syntax line makes BuildKit fetch a frontend image; the built-in one does.
    check(not re.search(r"^#\s*syntax\s*=", text, re.M | re.I), "no '# syntax=' line")
    names = [s[0] for s in stages]
    check(names == [BUILD_STAGE, API_STAGE, WORKER_STAGE],
          f"stages {BUILD_STAGE}, {API_STAGE}, {WORKER_STAGE} (the default target) ({names})")
    check(all(base == "debian:bookworm-slim" or base in names[:i] for i, (_, base, _) in enumerate(stages)),
          f"every stage FROM debian:bookworm-slim or an earlier stage ({[s[1] for s in stages]})")
    if names != [BUILD_STAGE, API_STAGE, WORKER_STAGE]:
        return
    build = stages[0][2]
    build_text = "\n".join(build)

    # One list, installed by the project's script: the shipped binaries' packages only.
    check(re.search(r"^COPY\s.*scripts/debian-packages-server\.txt", build_text, re.M) is not None
          and re.search(r"^COPY\s.*scripts/install-deps\.sh", build_text, re.M) is not None,
          "build stage COPYs scripts/debian-packages-server.txt and scripts/install-deps.sh")
    check(re.search(r"^RUN\s+(\./)?scripts/install-deps\.sh\s+(\./)?scripts/debian-packages-server\.txt\b",
                    build_text, re.M) is not None,
          "build stage RUNs scripts/install-deps.sh scripts/debian-packages-server.txt")
    check("debian-packages.txt" not in build_text, "build stage does not install the whole developer list")
    check("apt-get install" not in build_text, "build stage has no apt-get install of its own")
    # LibTorch: the torch wheel in a venv at a fixed path, which the binaries' RUNPATH names.
    venv = build_venv(build_text)
    check(venv is not None and venv.startswith("/") and "/src" not in venv,
          f"build stage makes the venv with RECAL_VENV=<absolute path outside /src> scripts/venv.sh ({venv})")
    builds = [l for l in build if l.startswith("RUN") and "cmake" in l]
    cmake_text = "\n".join(builds)
    check(venv is not None and re.search(r"-DRECAL_PYTHON=" + re.escape(venv) + r"/bin/python\b", cmake_text) is not None,
          f"build stage configures -DRECAL_PYTHON={venv}/bin/python (LibTorch from that venv)")
    check("recal-server" in cmake_text and "recal-worker" in cmake_text and "recalctl" in cmake_text
          and "--preset default" in cmake_text,
          "build stage builds recal-server, recal-worker and recalctl with the default preset")
    check(re.search(r"-DRECAL_BUILD_TESTS=OFF\b", cmake_text) is not None,
          "build stage configures -DRECAL_BUILD_TESTS=OFF")
    check(re.search(r"-DCMAKE_BUILD_TYPE=(Release|MinSizeRel)\b", cmake_text) is not None
          or re.search(r"\bstrip\b", text) is not None,
          "no debug info ships: Release (or strip)")
    check(re.search(r"^ARG\s+RECAL_VERSION\b", build_text, re.M) is not None
          and re.search(r"-DRECAL_VERSION=\"?\$\{?RECAL_VERSION\}?\"?", cmake_text) is not None,
          "build stage passes ARG RECAL_VERSION to CMake (-DRECAL_VERSION)")

    # Each runtime stage installs exactly its list (the worker stage adds its own to api's).
    own = {API_STAGE: stages[1][2], WORKER_STAGE: stages[2][2]}
    lists = {API_STAGE: "runtime-packages.txt", WORKER_STAGE: "runtime-packages-worker.txt"}
    check(stages[2][1] == API_STAGE, f"the worker stage is built FROM api, so it holds what api holds ({stages[2][1]})")
    for stage, lines in own.items():
        stage_text = "\n".join(lines)
        copy_list = re.search(r"^COPY\s+(?!--from)\S*deploy/" + re.escape(lists[stage]) + r"\s+(\S+)$", stage_text, re.M)
        check(copy_list is not None, f"{stage} stage COPYs deploy/{lists[stage]}")
        installs = [l for l in lines if l.startswith("RUN") and "apt-get install" in l]
        check(len(installs) == 1, f"{stage} stage has one apt-get install ({len(installs)})")
        if copy_list and installs:
            dest = copy_list.group(1)
            inst = installs[0]
            check(dest in inst.split("apt-get install", 1)[1], f"{stage}: apt-get install reads {dest}")
            # Nothing but the file's packages: no package names written after install's options.
            args = inst.split("apt-get install", 1)[1]
            args = re.sub(r"\$\([^)]*\)", " ", args).split("&&")[0].split()
            extra = [a for a in args if not a.startswith("-")]
            check(not extra, f"{stage}: apt-get install names no package of its own ({extra})")
    literal = [p for p in runtime_pkgs + worker_pkgs
               if re.search(r"(?<![\w.+-])" + re.escape(p) + r"(?![\w.+-])", text)]
    check(not literal, f"Dockerfile does not repeat the runtime lists ({literal})")

    # What each image holds: the api image no LibTorch at all, the worker image everything.
    api_lines, worker_lines = stage_lines(stages, API_STAGE), stage_lines(stages, WORKER_STAGE)
    api_has, worker_has = copied_names(api_lines), copied_names(worker_lines)
    check({"recal-server", "recalctl"} <= api_has, f"api stage copies recal-server and recalctl ({sorted(api_has)})")
    api_wheel, _ = wheel_copies(api_lines, venv)
    check(not api_has & {"recal-worker", "librecal_engine.so"} and not api_wheel
          and not re.search(r"site-packages|torch|nvidia", "\n".join(l for l in api_lines if l.startswith("COPY"))),
          f"api stage copies no recal-worker, librecal_engine.so or LibTorch "
          f"({sorted(api_has & {'recal-worker', 'librecal_engine.so'})}, {sorted(api_wheel)})")
    check({"librecal_engine.so", "recal-worker"} <= set(copied_names(own[WORKER_STAGE])),
          "worker stage copies librecal_engine.so and recal-worker")
    check({"recal-server", "recalctl", "recal-worker", "librecal_engine.so"} <= worker_has,
          "the worker image holds recal-server, recal-worker (beside it), recalctl and librecal_engine.so")
    wheel, moved = wheel_copies(own[WORKER_STAGE], venv)
    bad = sorted(d for d in wheel if not WHEEL_LIB_DIR.match(d.split("site-packages/", 1)[-1])
                 or not d.startswith("lib/python3"))
    check(wheel and not moved and not bad,
          f"worker stage copies the wheel's library directories (torch/lib, nvidia/*/lib) from {venv} to the same "
          f"paths, and nothing else of the venv ({sorted(wheel)}; elsewhere: {moved}; not a library directory: {bad})")
    image["venv"], image["wheel_dirs"] = venv, wheel

    # The same entrypoint, health check and user in both (the worker inherits them from api).
    api_entry, api_env = image_of(api_lines)
    check((api_entry, api_env) == (image["entrypoint"], image["env"]),
          f"api and worker images share ENTRYPOINT and ENV ({api_entry}, {image['entrypoint']})")
    for stage, lines in ((API_STAGE, api_lines), (WORKER_STAGE, worker_lines)):
        check_runtime_image(stage, lines, image, shared_dirs)


def check_runtime_image(stage, lines, image, shared_dirs):
    """What both runtime images must be: user 10001, volumes, ports, entrypoint, health check."""
    text = "\n".join(lines)
    # The user: group 10001 first, so that the user's gid is 10001 too (not the next system gid).
    group = re.search(r"\bgroupadd\b[^&;]*--gid[ =]10001\b[^&;]*\brecal\b", text)
    user = re.search(r"\buseradd\b(?=[^&;]*--uid[ =]10001\b)(?=[^&;]*--gid[ =](10001|recal)\b)[^&;]*\brecal\b", text)
    check(group is not None and user is not None and group.start() < user.start(),
          f"{stage}: groupadd --gid 10001 recal, then useradd --uid 10001 --gid 10001 recal")
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    check(users and users[-1] in ("recal", "10001"), f"{stage}: runs as user recal ({users})")
    # A fresh named volume takes the owner of the directory it is mounted on.
    for d in sorted(shared_dirs):
        check(re.search(r"\bchown\b[^&;]*\s" + re.escape(d) + r"(\s|$)", text) is not None,
              f"{stage}: creates {d} (the cluster's blob volume) owned by recal")
    expose = set()
    for l in lines:
        if l.startswith("EXPOSE"):
            expose |= set(l.split()[1:])
    check({"50051", "9464"} <= expose, f"{stage}: EXPOSE 50051 9464 ({sorted(expose)})")
    check(re.search(r"^VOLUME\s+\[?\"?/var/lib/recal", text, re.M) is not None, f"{stage}: VOLUME /var/lib/recal")

    entry, env = image_of(lines)
    want = ["--data_dir=/var/lib/recal", "--data_root=/data",
            "--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", "--auth_file=/run/secrets/recal_auth"]
    check(entry[:1] == ["recal-entrypoint"] and set(want) <= set(entry[1:]), f"{stage}: ENTRYPOINT {entry}")
    check(re.search(r"^COPY\s+(?!--from)(--chmod=\S+\s+)?deploy/recal-entrypoint\.sh\s+/usr/local/bin/recal-entrypoint$",
                    text, re.M) is not None,
          f"{stage}: installs deploy/recal-entrypoint.sh as /usr/local/bin/recal-entrypoint")
    flags = parse_flags(entry, f"{stage} ENTRYPOINT")
    check_metrics_scrapable(flags, f"{stage} ENTRYPOINT")
    listen = port_of(last(flags, "listen"))
    # The health check follows the configuration: shell form, $RECAL_HEALTH_ADDRESS, whose
    # default (ENV) is the ENTRYPOINT's --listen port.
    health = [l for l in lines if l.startswith("HEALTHCHECK")]
    cmd = health[-1].split(" CMD ", 1)[1].strip() if health and " CMD " in health[-1] else ""
    check(cmd != "" and not cmd.startswith("[")
          and re.match(r'recalctl\s+--server[= ]"?\$\{?RECAL_HEALTH_ADDRESS\}?"?\s+health\b', cmd) is not None,
          f"{stage}: HEALTHCHECK CMD recalctl --server=\"$RECAL_HEALTH_ADDRESS\" health, shell form ({cmd})")
    default = env.get("RECAL_HEALTH_ADDRESS")
    check(default is not None and port_of(default) == listen,
          f"{stage}: ENV RECAL_HEALTH_ADDRESS={default}: the ENTRYPOINT's --listen port {listen}")


def check_entrypoint_script(source):
    """deploy/recal-entrypoint.sh with a stub recal-server: arguments passed as they are,
    RECAL_PGPASSWORD_FILE's content as PGPASSWORD, a missing file refused."""
    print("(c) deploy/recal-entrypoint.sh")
    script = os.path.join(source, "deploy", "recal-entrypoint.sh")
    if not check(os.path.isfile(script), "deploy/recal-entrypoint.sh exists"):
        return
    check(os.access(script, os.X_OK), "deploy/recal-entrypoint.sh is executable")
    with tempfile.TemporaryDirectory() as tmp:
        stub = os.path.join(tmp, "recal-server")
        with open(stub, "w") as f:
            f.write('#!/bin/sh\nprintf "%s\\n" "PGPASSWORD=${PGPASSWORD-<unset>}" '
                    '"FILE=${RECAL_PGPASSWORD_FILE-<unset>}" "$@"\n')
        os.chmod(stub, 0o755)
        secret = os.path.join(tmp, "pg_password")
        with open(secret, "w") as f:
            f.write("s3cret with blanks\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and not k.startswith("RECAL_")}
        env["PATH"] = tmp + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        args = ["--listen=0.0.0.0:50051", "--data_root=a b"]

        def run(extra):
            return subprocess.run(["/bin/sh", script] + args, env=dict(env, **extra),
                                  capture_output=True, text=True, timeout=30)
        r = run({"RECAL_PGPASSWORD_FILE": secret})
        check(r.returncode == 0 and r.stdout.splitlines() ==
              ["PGPASSWORD=s3cret with blanks", "FILE=<unset>"] + args,
              f"with RECAL_PGPASSWORD_FILE: execs recal-server with the same arguments and "
              f"PGPASSWORD from the file ({r.returncode}, {r.stdout.splitlines()}, {r.stderr.strip()})")
        r = run({})
        check(r.returncode == 0 and r.stdout.splitlines() == ["PGPASSWORD=<unset>", "FILE=<unset>"] + args,
              f"without it: the same arguments, no PGPASSWORD ({r.returncode}, {r.stdout.splitlines()})")
        r = run({"RECAL_PGPASSWORD_FILE": os.path.join(tmp, "missing")})
        check(r.returncode != 0 and "PGPASSWORD" not in r.stdout and "RECAL_PGPASSWORD_FILE" in r.stderr,
              f"a missing file: refused before recal-server starts ({r.returncode}, {r.stderr.strip()})")
        check_entrypoint_as_pid1(script, tmp, env, args)


def check_entrypoint_as_pid1(script, tmp, env, args):
    """As a container's PID 1 (no init), the script stays recal-server's parent, passes on
    SIGHUP, and SIGINT / SIGTERM as SIGTERM, and exits with its status: a sandboxed worker
    refuses to start under a server that is PID 1. Needs a PID namespace (unshare); skipped
    where none can be made."""
    unshare = shutil.which("unshare")
    namespace = [unshare, "--user", "--map-root-user", "--pid", "--fork"] if unshare else []
    if not unshare or subprocess.run(namespace + ["true"], capture_output=True, timeout=30).returncode != 0:
        print("  note entrypoint as PID 1 not checked: no PID namespace here (unshare)")
        return
    stub = os.path.join(tmp, "recal-server")
    with open(stub, "w") as f:
        f.write("#!/bin/sh\ntrap 'echo HUP' HUP\ntrap 'echo TERM; exit 7' TERM\necho \"pid=$$ args=$*\"\n"
                "while :; do sleep 0.05; done\n")

    def child_of(pid):
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                children = f.read().split()
            return int(children[0]) if children else None
        except OSError:
            return None

    def catches(pid, *signals):  # whether `pid` has handlers for all of `signals`
        try:
            with open(f"/proc/{pid}/status") as f:
                caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", f.read(), re.M).group(1), 16)
            return all(caught & (1 << (s - 1)) for s in signals)
        except (OSError, AttributeError):
            return False

    for signal in ("TERM", "INT"):
        proc = subprocess.Popen(namespace + ["/bin/sh", script] + args, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        shell = server = None
        out = ""
        try:
            for _ in range(200):  # both have set their traps
                shell = shell or child_of(proc.pid)
                server = server or (shell and child_of(shell))
                if server and catches(shell, 1, 2, 15) and catches(server, 1, 15):
                    break
                time.sleep(0.05)
            os.kill(shell, 1)  # SIGHUP
            time.sleep(0.5)
            os.kill(shell, 15 if signal == "TERM" else 2)
            out, _ = proc.communicate(timeout=10)
        except (OSError, TypeError, subprocess.TimeoutExpired) as e:
            out = f"{type(e).__name__}: {e}"
        finally:
            for pid in (shell, proc.pid):
                if pid and proc.poll() is None:
                    try:
                        os.kill(pid, 9)
                    except OSError:
                        pass
            if proc.poll() is None:
                proc.communicate()
        lines = out.splitlines()
        check(lines == ["pid=2 args=" + " ".join(args), "HUP", "TERM"] and proc.returncode == 7,
              f"as PID 1: recal-server runs as its child (PID 2), gets SIGHUP, and SIG{signal} as SIGTERM; "
              f"its exit status is the container's ({proc.returncode}, {lines})")


# --------------------------------------------------------------------------- (d)
def installed_packages():
    """{name: (depends alternatives, provides)} of installed packages."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package}\t${db:Status-Abbrev}\t${Pre-Depends}\t${Depends}\t${Provides}\n"],
        capture_output=True, text=True, check=True).stdout
    pkgs, provides = {}, {}
    def names(field):
        return [re.sub(r"\s*\(.*?\)|:\S+", "", a).strip() for a in field.split("|")]
    for line in out.splitlines():
        name, status, pre, dep, prov = (line.split("\t") + [""] * 5)[:5]
        if not status.startswith("ii"):
            continue
        groups = [names(g) for g in (pre + "," + dep).split(",") if g.strip()]
        pkgs[name] = groups
        for p in prov.split(","):
            if p.strip():
                provides.setdefault(names(p)[0], set()).add(name)
    return pkgs, provides


def closure(roots, pkgs, provides):
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for alts in pkgs.get(p, []):
            for a in alts:  # every installed alternative (or provider) counts
                if a in pkgs:
                    todo.append(a)
                todo.extend(provides.get(a, ()))
    return seen


def ldd(binary):
    r = subprocess.run(["ldd", binary], capture_output=True, text=True)
    if r.returncode != 0:
        check(False, f"ldd {binary}: {r.stderr.strip()}")
        return {}, []
    libs, missing = {}, []
    for line in r.stdout.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(.*?)\s*(\(0x[0-9a-f]+\))?$", line)
        if not m:
            continue  # linux-vdso.so.1, the loader
        if m.group(2) == "not found":
            missing.append(m.group(1))
        else:
            libs[m.group(1)] = m.group(2)
    return libs, missing


def usr_variants(path):
    out = {path, os.path.realpath(path)}
    for p in list(out):
        if p.startswith("/usr/"):
            out.add(p[4:])
        elif p.startswith("/lib") or p.startswith("/bin") or p.startswith("/sbin"):
            out.add("/usr" + p)
    return out


def owners(paths):
    """{path: {package}} from one dpkg -S call (usr-merge and symlinks tried)."""
    variants = {p: usr_variants(p) for p in paths}
    args = sorted(set().union(*variants.values())) if variants else []
    r = subprocess.run(["dpkg", "-S"] + args, capture_output=True, text=True)
    by_file = {}
    for line in r.stdout.splitlines():
        if line.startswith("diversion "):
            continue
        pk, _, f = line.partition(": ")
        by_file.setdefault(f.strip(), set()).update(re.sub(r":\S+", "", x).strip() for x in pk.split(","))
    return {p: set().union(*(by_file.get(v, set()) for v in vs)) for p, vs in variants.items()}


# Libraries of the wheel whose own dependencies are not checked, and why: parts of CUDA's
# libraries that LibTorch never loads on one machine, which need what no image here has.
WHEEL_UNCHECKED = {
    re.compile(r"^libcufile_rdma\.so"): "cuFile's GPUDirect Storage over RDMA (InfiniBand), loaded only where configured",
    re.compile(r"^nvshmem_(bootstrap|transport)_"): "NVSHMEM's multi-node bootstraps and transports (MPI, PMIx, "
                                                   "OpenSHMEM, libfabric, UCX, InfiniBand), loaded only where configured",
    re.compile(r"^libcusolverMg\.so"): "cuSOLVER's multi-GPU API, which LibTorch does not use",
}
# LibTorch's and CUDA's libraries, by name (wherever they come from).
TORCH_OR_CUDA = re.compile(r"^lib(torch|c10|caffe2|cudart|cudnn|cublas|cufft|cufile|curand|cusparse|cusolver|"
                           r"cupti|nvrtc|nvJitLink|nvToolsExt|nvshmem|nccl|cuda\.)")
# What a GPU host brings: the driver's library, mounted by the NVIDIA container toolkit.
DRIVER_LIBS = {"libcuda.so.1"}


def venv_part(path):
    """(venv, directory relative to it) of a library inside a Python venv's site-packages,
    else None: /v/lib/python3.11/site-packages/torch/lib/../../nvidia/cu13/lib/x.so ->
    ("/v", "lib/python3.11/site-packages/nvidia/cu13/lib")."""
    path = os.path.normpath(path)
    m = re.match(r"^(.*?)/(lib/python3[.\d]*/site-packages/.*)/[^/]+$", path)
    return (m.group(1), m.group(2)) if m else None


def check_debian_libs(libs, allowed, lists, where):
    """Every library (name -> path) a Debian package's, one of `allowed`."""
    own = owners(sorted(set(libs.values())))
    unowned = sorted(f"{k} ({v})" for k, v in libs.items() if not own[v])
    check(not unowned, f"{where}: every library belongs to a Debian package ({unowned})")
    outside = sorted(f"{k} ({'/'.join(sorted(own[v]))})" for k, v in libs.items()
                     if own[v] and not own[v] & allowed)
    check(not outside, f"{where}: {len(libs)} libraries, all from {lists} or their Depends (outside: {outside})")
    direct = set()
    for v in libs.values():
        direct |= own[v]
    return direct


def check_runtime_deps(api_binaries, binaries, runtime_pkgs, worker_pkgs, image, sanitizer_build=False):
    """The api image's binaries load only libraries of deploy/runtime-packages.txt's packages;
    the worker image's load those, deploy/runtime-packages-worker.txt's, and the torch wheel's
    from the directories the Dockerfile's worker stage copies, whose own needs are met too."""
    print("(d) runtime libraries")
    if not shutil.which("dpkg-query") or not shutil.which("ldd"):
        check(False, "dpkg-query and ldd are needed")
        return
    pkgs, provides = installed_packages()
    absent = [p for p in runtime_pkgs + worker_pkgs if p not in pkgs]
    check(not absent, f"every runtime package is installed here, so its Depends are known ({absent})")
    api_allowed = closure([p for p in runtime_pkgs if p in pkgs], pkgs, provides)
    worker_allowed = closure([p for p in runtime_pkgs + worker_pkgs if p in pkgs], pkgs, provides)
    print(f"  note api image: {len(runtime_pkgs)} runtime packages, {len(api_allowed)} with their Depends; "
          f"worker image: {len(runtime_pkgs) + len(worker_pkgs)}, {len(worker_allowed)}")
    loaded = {}
    for b in sorted(set(binaries) | set(api_binaries)):
        found, missing = ldd(b)
        check(not missing, f"{os.path.basename(b)}: every library found ({missing})")
        if sanitizer_build:
            runtimes = sorted(k for k in found if SANITIZER_RUNTIMES.match(k))
            if runtimes:
                print(f"  note {os.path.basename(b)}: left out, a sanitizer build's runtimes: {runtimes}")
            found = {k: v for k, v in found.items() if not SANITIZER_RUNTIMES.match(k)}
        loaded[b] = {k: v for k, v in found.items() if k not in OWN_LIBS}
        wheel = sum(1 for v in loaded[b].values() if venv_part(v))
        print(f"  note {os.path.basename(b)}: {len(found)} libraries, {wheel} of them the torch wheel's")

    # The api image: Debian's libraries only, and no LibTorch or CUDA library at all.
    api_libs = {}
    for b in api_binaries:
        api_libs.update(loaded.get(b, {}))
    torch_like = sorted(k for k, v in api_libs.items() if venv_part(v) or TORCH_OR_CUDA.match(k))
    check(api_binaries and not torch_like,
          f"api image ({', '.join(os.path.basename(b) for b in api_binaries)}): no LibTorch or CUDA library ({torch_like})")
    direct = check_debian_libs({k: v for k, v in api_libs.items() if not venv_part(v)}, api_allowed,
                               "deploy/runtime-packages.txt", "api image")
    unused = [p for p in runtime_pkgs if p not in closure(direct & api_allowed, pkgs, provides)]
    if unused:
        print(f"  note deploy/runtime-packages.txt: no library of the api binaries comes from {unused}")

    # The worker image: every binary, Debian's libraries and the wheel's.
    debian, wheel = {}, {}
    for b in binaries:
        for k, v in loaded[b].items():
            (wheel if venv_part(v) else debian)[k] = v
    direct = check_debian_libs(debian, worker_allowed, "deploy/runtime-packages.txt and -worker.txt", "worker image")
    venvs = {venv_part(v)[0] for v in wheel.values()}
    dirs = {venv_part(v)[1] for v in wheel.values()}
    copied = image.get("wheel_dirs") or set()
    check(len(venvs) <= 1, f"the wheel's libraries come from one venv ({sorted(venvs)})")
    check(not dirs - copied,
          f"worker image: the {len(wheel)} wheel libraries lie in directories its stage copies "
          f"(not copied: {sorted(dirs - copied)}; copied: {sorted(copied)})")
    if not venvs:
        check(not wheel, "the binaries load the torch wheel's libraries from a venv")
        return
    venv = venvs.pop()
    # libtorch_cpu.so dlopens parts of CUDA late (cuDNN's sub-libraries, NVRTC): ldd of the
    # binaries does not see them, so every nvidia/*/lib of the wheel is copied.
    torch_lib = [d for d in dirs if d.endswith("/torch/lib")]
    if not check(torch_lib, f"the worker binaries load LibTorch from a wheel's torch/lib ({sorted(dirs)})"):
        return
    site = os.path.dirname(os.path.dirname(torch_lib[0]))
    nvidia = os.path.join(venv, site, "nvidia")
    present = {os.path.join(site, "nvidia", n, "lib") for n in (os.listdir(nvidia) if os.path.isdir(nvidia) else [])
               if os.path.isdir(os.path.join(nvidia, n, "lib"))}
    check(not present - copied, f"worker image: every nvidia/*/lib of the wheel is copied (missing: {sorted(present - copied)})")
    # What the copied libraries need in turn: the wheel's own, Debian's of the worker image's
    # lists, or the driver's.
    needs, unchecked, shipped = {}, set(), 0
    for d in sorted(copied):
        full = os.path.join(venv, d)
        for f in sorted(os.listdir(full)) if os.path.isdir(full) else []:
            if ".so" not in f or not os.path.isfile(os.path.join(full, f)):
                continue
            if any(p.match(f) for p in WHEEL_UNCHECKED):
                unchecked.add(f)
                continue
            shipped += 1
            r = subprocess.run(["ldd", os.path.join(full, f)], capture_output=True, text=True)
            for line in r.stdout.splitlines():
                m = re.match(r"\s*(\S+)\s+=>\s+(.*?)\s*(\(0x[0-9a-f]+\))?$", line)
                if not m or m.group(1) in DRIVER_LIBS:
                    continue
                inside = venv_part(m.group(2))
                if inside and inside[0] == venv:
                    if inside[1] not in copied:
                        needs.setdefault(m.group(1), set()).add(("not copied", f))
                else:
                    needs.setdefault(m.group(1), set()).add((m.group(2), f))
    missing = sorted(f"{k} ({', '.join(sorted(f for _, f in v))})" for k, v in needs.items()
                     if any(p in ("not found", "not copied") for p, _ in v))
    check(not missing, f"worker image: the {shipped} copied wheel libraries find what they link (not found: {missing})")
    found = {k: next(p for p, _ in v) for k, v in needs.items()
             if all(p not in ("not found", "not copied") for p, _ in v)}
    direct |= check_debian_libs(found, worker_allowed, "deploy/runtime-packages.txt and -worker.txt",
                                "the wheel's libraries")
    for reason in sorted(set(WHEEL_UNCHECKED.values())):
        names = sorted(f for f in unchecked if any(p.match(f) and r == reason for p, r in WHEEL_UNCHECKED.items()))
        if names:
            print(f"  note not checked, {reason}: {names}")
    unused = [p for p in worker_pkgs if p not in closure(direct & worker_allowed, pkgs, provides)]
    if unused:
        print(f"  note deploy/runtime-packages-worker.txt: no library of the worker image comes from {unused}")


# --------------------------------------------------------------------------- (e)
def k8s_docs(directory, kustomization):
    """{(kind, name): doc} of the files the kustomization lists (directories: recursively)."""
    out = {}
    for res in kustomization.get("resources") or []:
        path = os.path.normpath(os.path.join(directory, res))
        if os.path.isdir(path):
            k = load_yaml(os.path.join(path, "kustomization.yaml"))
            if k:
                out.update(k8s_docs(path, k))
            continue
        for d in load_yaml_docs(path) or []:
            if isinstance(d, dict):
                out[(d.get("kind"), (d.get("metadata") or {}).get("name"))] = d
    return out


def json_pointer_add(doc, path, value):
    """RFC 6902 'add' (what kustomize applies from a JSON 6902 patch); False if the parent is missing."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    cur = doc
    for p in parts[:-1]:
        if isinstance(cur, list):
            if not p.isdigit() or int(p) >= len(cur):
                return False
            cur = cur[int(p)]
        elif isinstance(cur, dict) and p in cur:
            cur = cur[p]
        else:
            return False
    key = parts[-1]
    if isinstance(cur, list):
        if key == "-":
            cur.append(value)
        elif key.isdigit() and int(key) <= len(cur):
            cur.insert(int(key), value)
        else:
            return False
    elif isinstance(cur, dict):
        cur[key] = value
    else:
        return False
    return True


# What the downward API gives a variable (env valueFrom.fieldRef), as a stand-in value.
POD_FIELDS = {"status.podIP": "10.244.0.7"}


def k8s_argv(container, image, configmaps, where):
    """command + args as the kubelet runs them: $(VAR) replaced from the container's env."""
    env, secret_vars = {}, set()
    for e in container.get("env") or []:
        name, ref = e.get("name"), (e.get("valueFrom") or {})
        if "value" in e:
            env[name] = str(e["value"])
        elif "configMapKeyRef" in ref:
            cm = ref["configMapKeyRef"]
            value = ((configmaps.get(cm.get("name")) or {}).get("data") or {}).get(cm.get("key"))
            check(value is not None, f"{where}: env {name} from ConfigMap {cm.get('name')}/{cm.get('key')}, which exists")
            env[name] = str(value)
        elif "secretKeyRef" in ref:
            secret_vars.add(name)
        elif "fieldRef" in ref:
            path = (ref["fieldRef"] or {}).get("fieldPath")
            check(path in POD_FIELDS, f"{where}: env {name} from the downward API's {path}, one recal may use")
            env[name] = POD_FIELDS.get(path, "")
    # command replaces the image's ENTRYPOINT, args its CMD (the image has none).
    words = list(container.get("command") or image["entrypoint"]) + list(container.get("args") or [])
    used_secrets = set()

    def expand(w):
        def sub(m):
            if m.group(1) in secret_vars:
                used_secrets.add(m.group(1))
            return env.get(m.group(1), m.group(0))
        return re.sub(r"\$\((\w+)\)", sub, str(w))
    argv = [expand(w) for w in words]
    check(not used_secrets, f"{where}: no Secret-backed variable on the command line ({sorted(used_secrets)})")
    unresolved = [a for a in argv if re.search(r"\$\(\w+\)", a)]
    check(not unresolved, f"{where}: every $(VAR) is defined ({unresolved})")
    return argv, env


def check_pod(dep, image, docs, where, expect_role):
    """One Deployment's pod: the recal container's flags, ports, probes, volumes and security."""
    configmaps = {n: d for (k, n), d in docs.items() if k == "ConfigMap"}
    secrets = {n: d for (k, n), d in docs.items() if k == "Secret"}
    claims = {n: d for (k, n), d in docs.items() if k == "PersistentVolumeClaim"}
    tmpl = (dep.get("spec") or {}).get("template") or {}
    pod = tmpl.get("spec") or {}
    containers = pod.get("containers") or []
    check(len(containers) == 1, f"{where}: one container ({[c.get('name') for c in containers]})")
    if not containers:
        return {}
    c = containers[0]
    argv, env = k8s_argv(c, image, configmaps, where)
    check(argv[:1] and argv[0] in SERVER_PROGRAMS, f"{where}: runs recal-server ({argv[:1]})")
    flags = parse_flags(argv, where)
    check_no_password_in_argv(argv, where)
    role = last(flags, "role", "all")
    check(role == expect_role, f"{where}: --role={role}")
    # The compose files' image names (kustomization.yaml's images: renames both for a registry).
    want = IMAGE_NAMES[image_for(role)]
    check(str(c.get("image", "")).rpartition(":")[0] == want,
          f"{where}: the {image_for(role)} image, {want} ({c.get('image')})")
    check_metrics_scrapable(flags, where)
    listen_addr, metrics_addr = last(flags, "listen"), last(flags, "metrics_listen")
    listen, metrics = port_of(listen_addr), port_of(metrics_addr)
    check(listen and metrics and not str(listen_addr).startswith("127.") and not str(metrics_addr).startswith("127."),
          f"{where}: --listen={listen_addr} and --metrics_listen={metrics_addr} beyond loopback")
    check_store_uri(last(flags, "store"), where)

    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    check(ports.get("grpc") == listen and ports.get("metrics") == metrics,
          f"{where}: containerPorts grpc={ports.get('grpc')} metrics={ports.get('metrics')} "
          f"are the --listen {listen} and --metrics_listen {metrics} ports")
    # Native gRPC probes (grpc.health.v1) on the listen port, nothing else.
    for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
        probe = c.get(kind)
        if probe is None and kind == "startupProbe":
            continue
        check(isinstance(probe, dict) and set(probe) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}
              and (probe.get("grpc") or {}).get("port") == listen,
              f"{where}: {kind} is a gRPC probe on port {listen} ({probe})")
    ann = (tmpl.get("metadata") or {}).get("annotations") or {}
    check(ann.get("prometheus.io/scrape") == "true" and str(ann.get("prometheus.io/port")) == str(metrics)
          and ann.get("prometheus.io/path", "/metrics") == "/metrics",
          f"{where}: prometheus.io/scrape and port {ann.get('prometheus.io/port')} = --metrics_listen port")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    check(grace > SHUTDOWN_TIMEOUT_S, f"{where}: terminationGracePeriodSeconds {grace} > {SHUTDOWN_TIMEOUT_S}")
    res = c.get("resources") or {}
    check(all(k in (res.get(x) or {}) for x in ("requests", "limits") for k in ("cpu", "memory")),
          f"{where}: cpu and memory requests and limits ({res})")

    # Non-root, no privilege; the sandbox needs none (worker.yaml says what it needs instead).
    psc, csc = pod.get("securityContext") or {}, c.get("securityContext") or {}
    def get(key):
        return csc.get(key, psc.get(key))
    check(get("runAsNonRoot") is True and get("runAsUser") == 10001 and get("runAsGroup") in (None, 10001),
          f"{where}: runAsNonRoot, uid 10001 ({get('runAsNonRoot')}, {get('runAsUser')}, {get('runAsGroup')})")
    check(csc.get("allowPrivilegeEscalation") is False and csc.get("readOnlyRootFilesystem") is True
          and not csc.get("privileged"), f"{where}: allowPrivilegeEscalation false, readOnlyRootFilesystem, not privileged")
    caps = csc.get("capabilities") or {}
    check("ALL" in (caps.get("drop") or []) and not caps.get("add"), f"{where}: capabilities drop ALL, add none ({caps})")
    seccomp = (get("seccompProfile") or {}).get("type")
    check(seccomp in ("RuntimeDefault", "Localhost"), f"{where}: seccompProfile RuntimeDefault or Localhost ({seccomp})")

    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    mounts = {m.get("mountPath"): m for m in c.get("volumeMounts") or []}
    check(all(m.get("name") in volumes for m in mounts.values()), f"{where}: every volumeMount names a volume")

    def volume_at(path):
        """(mount, volume) of the mount that holds path (the longest mountPath above it)."""
        best = None
        for mp, m in mounts.items():
            if path == mp or path.startswith(mp.rstrip("/") + "/"):
                if best is None or len(mp) > len(best):
                    best = mp
        return (mounts[best], volumes.get(mounts[best].get("name"))) if best else (None, None)

    blob = last(flags, "blobs") or ""
    blob_dir = blob.partition("file:")[2]
    m, v = volume_at(blob_dir)
    claim = ((v or {}).get("persistentVolumeClaim") or {}).get("claimName")
    modes = ((claims.get(claim) or {}).get("spec") or {}).get("accessModes") or []
    check(blob.startswith("file:") and m is not None and m.get("mountPath") == blob_dir and not m.get("readOnly")
          and "ReadWriteMany" in modes,
          f"{where}: --blobs={blob} is a writable ReadWriteMany claim ({claim}, {modes})")
    roots = [r.split("=")[-1] for v_ in (val for n, val in flags if n == "data_root") for r in v_.split(",")]
    ro = [r for r in roots if (volume_at(r)[0] or {}).get("readOnly") is True]
    check(roots and ro == roots, f"{where}: every --data_root is a read-only mount ({roots})")
    for path in (last(flags, "data_dir"), "/tmp"):
        check(volume_at(path or "")[0] is not None,
              f"{where}: {path} is a volume (the root filesystem is read-only)")

    # Credentials: files of the Secret, never a literal value in the manifest.
    def secret_file(path, what):
        m, v = volume_at(path or "")
        secret = ((v or {}).get("secret") or {}).get("secretName")
        key = os.path.relpath(path, m.get("mountPath")) if m else None
        sdoc = secrets.get(secret) or {}
        keys = set((sdoc.get("data") or {})) | set((sdoc.get("stringData") or {}))
        check(secret in secrets and key in keys and m.get("readOnly") is True,
              f"{where}: {what} {path} is key {key} of the Secret {secret}, mounted read-only")
    secret_file(last(flags, "auth_file"), "--auth_file")
    if role == "api":
        check(bool(last(flags, "internal_token_file")),
              f"{where}: --role=api gets the cluster secret it needs (the workers inspect its uploads)")
    secret_file(last(flags, "internal_token_file"), "--internal_token_file")
    secret_file(env.get("RECAL_PGPASSWORD_FILE"), "RECAL_PGPASSWORD_FILE")
    literal = [e.get("name") for e in c.get("env") or []
               if "PASSWORD" in str(e.get("name")) and not str(e.get("name")).endswith("_FILE")
               and "secretKeyRef" not in (e.get("valueFrom") or {})]
    check(not literal, f"{where}: no password in the manifest's env ({literal})")
    return {"flags": flags, "listen": listen, "metrics": metrics, "labels": (tmpl.get("metadata") or {}).get("labels") or {},
            "container": c, "claim": claim}


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_relay(docs, api, worker):
    """Client streams: api pods relay pushed batches to the worker pod running the job, at the
    address it advertises (its pod IP), with the same cluster secret; only api pods reach it."""
    check(last(api["flags"], "internal_token_file") == last(worker["flags"], "internal_token_file"),
          f"api and worker share --internal_token_file ({last(api['flags'], 'internal_token_file')})")
    internal = last(worker["flags"], "internal_listen", "0.0.0.0:50052")
    port = port_of(internal)
    cports = {p.get("name"): p.get("containerPort") for p in worker["container"].get("ports") or []}
    check(port and port not in (worker["listen"], worker["metrics"]) and not internal.startswith("127.")
          and cports.get("internal") == port,
          f"recal-worker: --internal_listen={internal} beyond loopback, containerPort internal={cports.get('internal')}")
    advertised = last(worker["flags"], "advertise_address", "")
    check(advertised == f"{POD_FIELDS['status.podIP']}:{port}",
          f"recal-worker: --advertise_address is $(POD_IP) from status.podIP and the --internal_listen port ({advertised})")
    policies = [d for (k, _), d in docs.items() if k == "NetworkPolicy"
                and selects(((d.get("spec") or {}).get("podSelector") or {}).get("matchLabels"), worker["labels"])]
    if not check(len(policies) == 1, f"one NetworkPolicy selects the worker pods ({len(policies)})"):
        return
    spec = policies[0].get("spec") or {}
    rules = spec.get("ingress") or []

    def ports_of(rule):
        return {p.get("port") for p in rule.get("ports") or []}

    def admits(labels, p):  # whether a pod with these labels may reach port p
        for rule in rules:
            if rule.get("ports") and p not in ports_of(rule):
                continue
            sources = rule.get("from")
            if not sources:
                return True
            if any(selects((s.get("podSelector") or {}).get("matchLabels"), labels) for s in sources):
                return True
        return False
    other = {"app.kubernetes.io/name": "someone-else"}
    check("Ingress" in (spec.get("policyTypes") or ["Ingress"])
          and admits(api["labels"], port) and not admits(worker["labels"], port) and not admits(other, port),
          f"NetworkPolicy: only api pods reach the workers' internal port {port}")
    check(admits(other, worker["listen"]) and admits(other, worker["metrics"]),
          f"NetworkPolicy: health ({worker['listen']}) and metrics ({worker['metrics']}) stay reachable")


def check_k8s(deploy, image):
    print("(e) deploy/k8s")
    directory = os.path.join(deploy, "k8s")
    kust = load_yaml(os.path.join(directory, "kustomization.yaml"))
    if kust is None:
        return
    listed = set(kust.get("resources") or [])
    present = {f for f in os.listdir(directory) if f.endswith((".yaml", ".yml")) and f != "kustomization.yaml"}
    check(listed == present and all(os.path.isfile(os.path.join(directory, f)) for f in listed),
          f"kustomization.yaml lists every manifest (listed {sorted(listed)}, present {sorted(present)})")
    docs = k8s_docs(directory, kust)
    for (kind, name), d in docs.items():
        check(d.get("apiVersion") and kind and name, f"{kind}/{name}: apiVersion, kind, metadata.name")

    cm = (docs.get(("ConfigMap", "recal-config")) or {}).get("data") or {}
    check(cm, "ConfigMap recal-config")
    check_store_uri(cm.get("RECAL_STORE"), "ConfigMap RECAL_STORE")
    secret = docs.get(("Secret", "recal-secrets")) or {}
    values = {**(secret.get("data") or {}), **(secret.get("stringData") or {})}
    check({"recal_auth", "recal_pg_password", "recal_internal_token"} <= set(values)
          and all("REPLACE" in str(v) for v in values.values()),
          f"Secret recal-secrets: a template, every value a REPLACE-ME placeholder ({sorted(values)})")

    pods = {}
    for role in ("api", "worker"):
        dep = docs.get(("Deployment", f"recal-{role}"))
        if not check(dep is not None, f"Deployment recal-{role}"):
            continue
        spec = dep.get("spec") or {}
        check(spec.get("replicas") == 2, f"recal-{role}: 2 replicas ({spec.get('replicas')})")
        pods[role] = check_pod(dep, image, docs, f"recal-{role}", role)
        sel = (spec.get("selector") or {}).get("matchLabels") or {}
        check(selects(sel, pods[role].get("labels", {})), f"recal-{role}: its selector matches its pods")
        pdbs = [d for (k, _), d in docs.items() if k == "PodDisruptionBudget"
                and ((d.get("spec") or {}).get("selector") or {}).get("matchLabels") == sel]
        ok = len(pdbs) == 1
        if ok:
            ps, replicas = pdbs[0].get("spec") or {}, spec.get("replicas", 1)

            def count(v):  # an integer or a percentage of the replicas
                v = str(v)
                return int(v[:-1]) * replicas // 100 if v.endswith("%") else int(v)
            ok = ("maxUnavailable" in ps and count(ps["maxUnavailable"]) >= 1) or (
                "minAvailable" in ps and count(ps["minAvailable"]) < replicas)
        check(ok, f"recal-{role}: one PodDisruptionBudget with its selector, which lets a drain proceed")
    if len(pods) == 2 and all(pods.values()):
        api, worker = pods["api"], pods["worker"]
        for flag in ("store", "blobs", "data_root"):
            check(last(api["flags"], flag) == last(worker["flags"], flag) and last(api["flags"], flag),
                  f"api and worker share --{flag} ({last(api['flags'], flag)})")
        check(api["claim"] == worker["claim"], f"api and worker mount the same blob claim ({api['claim']})")
        svc = docs.get(("Service", "recal-api")) or {}
        sel = (svc.get("spec") or {}).get("selector") or {}
        check(selects(sel, api["labels"]) and not selects(sel, worker["labels"]),
              "Service recal-api selects the api pods only")
        ports = {p.get("name"): p for p in (svc.get("spec") or {}).get("ports") or []}
        cports = {p.get("name"): p.get("containerPort") for p in api["container"].get("ports") or []}
        grpc = ports.get("grpc") or {}
        target = grpc.get("targetPort", grpc.get("port"))
        check(cports.get(target, target) == api["listen"],
              f"Service recal-api port grpc reaches the --listen port {api['listen']} ({target})")
        check_relay(docs, api, worker)
        cpu = str(((worker["container"].get("resources") or {}).get("limits") or {}).get("cpu", "0"))
        cpu = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
        threads = int(last(worker["flags"], "threads_per_worker", "0")) * int(last(worker["flags"], "cpu_workers", "1"))
        check(0 < threads <= cpu, f"recal-worker: --threads_per_worker x --cpu_workers = {threads} <= its CPU limit {cpu}")
    try:
        text = open(os.path.join(directory, "worker.yaml")).read()
    except OSError:
        text = ""
    check(all(w in text for w in ("CLONE_NEWUSER", "seccompProfile", "Landlock", "RuntimeDefault")),
          "worker.yaml says what the sandbox needs from the pod (user namespaces, seccomp, Landlock)")

    # The GPU overlay: the base plus a JSON 6902 patch of the worker.
    print("(e) deploy/k8s/gpu")
    gdir = os.path.join(directory, "gpu")
    gk = load_yaml(os.path.join(gdir, "kustomization.yaml"))
    if gk is None:
        return
    check([os.path.normpath(os.path.join(gdir, r)) for r in gk.get("resources") or []] == [directory],
          f"gpu/ builds on deploy/k8s ({gk.get('resources')})")
    patches = gk.get("patches") or []
    worker = copy.deepcopy(docs.get(("Deployment", "recal-worker")) or {})
    applied = 0
    for p in patches:
        target = p.get("target") or {}
        ops = load_yaml_docs(os.path.join(gdir, p.get("path", ""))) or [[]]
        ok = target.get("kind") == "Deployment" and target.get("name") == "recal-worker" and isinstance(ops[0], list)
        for op in ops[0] if ok else []:
            ok = op.get("op") == "add" and json_pointer_add(worker, op.get("path", ""), op.get("value")) and ok
        check(ok, f"gpu patch {p.get('path')} applies to Deployment recal-worker")
        applied += ok
    if applied and worker:
        c = worker["spec"]["template"]["spec"]["containers"][0]
        argv, _ = k8s_argv(c, image, {n: d for (k, n), d in docs.items() if k == "ConfigMap"}, "gpu recal-worker")
        flags = parse_flags(argv, "gpu recal-worker")
        limits = (c.get("resources") or {}).get("limits") or {}
        check(last(flags, "devices") == "auto" and str(limits.get("nvidia.com/gpu")) == "1",
              f"gpu recal-worker: --devices=auto and limits nvidia.com/gpu: 1 ({last(flags, 'devices')}, {limits})")
        # The worker image is CUDA-capable (the torch wheel's CUDA libraries): no image of its own.
        check(str(c.get("image", "")).rpartition(":")[0] == IMAGE_NAMES[WORKER_STAGE] and "images" not in gk,
              f"gpu recal-worker: the worker image, {IMAGE_NAMES[WORKER_STAGE]}, renamed by no images: ({c.get('image')})")


# --------------------------------------------------------------------------- (g)
def check_api_without_worker(server, recalctl):
    """The api image holds no recal-worker (and no LibTorch for one): recal-server --role=api
    must start and take uploads without it. Run here with --worker_binary naming a file that
    does not exist, on loopback, with the embedded store and no worker process: an upload is
    answered UNAVAILABLE, naming what to start. Without the cluster secret it does not start."""
    print("(g) --role=api without recal-worker (what the api image holds)")
    with tempfile.TemporaryDirectory(prefix="recal-api-") as tmp:
        r = subprocess.run([recalctl, "token", "new", "--tenant", "deploy", "--role", "submit"],
                           capture_output=True, text=True, timeout=30)
        lines = r.stdout.splitlines()
        if not check(r.returncode == 0 and len(lines) >= 2,
                     f"recalctl token new ({r.returncode}{'' if r.returncode == 0 else ', ' + r.stderr.strip()})"):
            return
        auth = os.path.join(tmp, "auth.txt")
        with open(auth, "w") as f:
            f.write(lines[1] + "\n")
        secret = os.path.join(tmp, "internal_token.txt")
        with open(secret, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            address = f"127.0.0.1:{sock.getsockname()[1]}"
        absent = os.path.join(tmp, "no-recal-worker")
        argv = [server, "--role=api", f"--data_dir={tmp}/data", f"--listen={address}", "--metrics_listen=",
                f"--auth_file={auth}", f"--worker_binary={absent}"]
        # No cluster secret: no way to have its uploads inspected, so it does not start.
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        check(r.returncode != 0 and "--internal_token_file" in r.stderr,
              f"--role=api without --internal_token_file does not start, saying so ({r.returncode}, "
              f"{(r.stderr.strip().splitlines() or [''])[-1]})")
        log_path = os.path.join(tmp, "server.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(argv + [f"--internal_token_file={secret}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            serving = False
            for _ in range(100):
                if proc.poll() is not None:
                    break
                serving = subprocess.run([recalctl, f"--server={address}", "health"], capture_output=True,
                                         timeout=30).returncode == 0
                if serving:
                    break
                time.sleep(0.2)
            with open(log_path) as f:
                last_line = (f.read().strip().splitlines() or [""])[-1]
            state = ("SERVING" if serving else f"exited {proc.returncode}" if proc.poll() is not None
                     else "not serving")
            if not check(serving, f"recal-server --role=api starts without recal-worker ({state}: {last_line})"):
                return
            junk = os.path.join(tmp, "junk.pt")
            with open(junk, "wb") as f:
                # A zip's magic and no directory: recalctl leaves the judgement to the server.
                f.write(b"PK\x03\x04" + b"not a TorchScript archive\n" * 40)
            # The answer is UNAVAILABLE, which recalctl retries for 2 minutes before it gives up:
            # what the server answered is in its log (every failed call is).
            try:
                r = subprocess.run([recalctl, f"--server={address}", "upload", junk], capture_output=True,
                                   text=True, timeout=15, env=dict(os.environ, RECAL_TOKEN=lines[0]))
                out = (r.stdout + r.stderr).strip().splitlines()
            except subprocess.TimeoutExpired:
                out = ["(recalctl still retrying after 15 s)"]
            with open(log_path) as f:
                said = f.read().splitlines()
            hint = [l for l in said if "start a --role=worker with --internal_token_file" in l]
            check(hint and not any(absent in l or "cannot start" in l for l in said + out),
                  f"--role=api answers an upload without recal-worker: UNAVAILABLE, no worker process is up to "
                  f"inspect it ({hint[-1:] or said[-1:]}; recalctl: {out[-1:]})")
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


# --------------------------------------------------------------------------- (f)
def check_build_list(source):
    print("(f) scripts/debian-packages-server.txt and -DRECAL_BUILD_TESTS=OFF")
    server_pkgs = read_list(os.path.join(source, "scripts", "debian-packages-server.txt"))
    all_pkgs = read_list(os.path.join(source, "scripts", "debian-packages.txt"))
    check(server_pkgs and set(server_pkgs) <= set(all_pkgs),
          f"a subset of scripts/debian-packages.txt ({sorted(set(server_pkgs) - set(all_pkgs))})")
    check(not set(server_pkgs) & TEST_ONLY_PKGS, f"no test-only package ({sorted(set(server_pkgs) & TEST_ONLY_PKGS)})")
    cmake, ninja = shutil.which("cmake"), shutil.which("ninja")
    if not cmake or not ninja:
        check(False, "cmake and ninja are needed")
        return
    with tempfile.TemporaryDirectory(prefix="recal-notests-") as tmp:
        # GoogleTest and Google Benchmark disabled: a find_package of either is then an error.
        # Without the CUDA kernels, as the Dockerfile's build stage (no CUDA toolkit there).
        r = subprocess.run([cmake, "-S", source, "-B", tmp, "-G", "Ninja", "-DRECAL_BUILD_TESTS=OFF",
                            "-DRECAL_CUDA_KERNELS=OFF",
                            "-DCMAKE_BUILD_TYPE=Release", "-DRECAL_VERSION=0.0.0-check",
                            "-DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON", "-DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON"],
                           capture_output=True, text=True, timeout=300)
        if not check(r.returncode == 0, "CMake configures -DRECAL_BUILD_TESTS=OFF without GTest and benchmark" +
                     ("" if r.returncode == 0 else ":\n" + r.stdout[-2000:] + r.stderr[-2000:])):
            return
        targets = subprocess.run([ninja, "-C", tmp, "-t", "targets", "all"], capture_output=True, text=True).stdout
        names = {l.split(":")[0] for l in targets.splitlines()}
        check({"recal-server", "recal-worker", "recalctl"} <= names and not any(n.endswith("_test") for n in names),
              "it has recal-server, recal-worker and recalctl and no test")
        build_ninja = open(os.path.join(tmp, "build.ninja")).read()
        check('RECAL_VERSION=\\"0.0.0-check\\"' in build_ninja, "-DRECAL_VERSION reaches recal_metrics")
        check(not re.search(r"gtest|gmock|libbenchmark", build_ninja), "nothing links GoogleTest or Google Benchmark")
        # Every file the configuration found comes from the list's packages or their Depends.
        found = set()
        for line in open(os.path.join(tmp, "CMakeCache.txt")):
            m = re.match(r"([^#/][^:=]*):(FILEPATH|PATH|STRING)=(/usr/.+)$", line.strip())
            if not m or "NOTFOUND" in m.group(3):
                continue
            path = m.group(3)
            if os.path.isdir(path):
                files = sorted(f for f in os.listdir(path) if os.path.isfile(os.path.join(path, f)))
                path = os.path.join(path, files[0]) if files else None
            if path and os.path.exists(path):
                found.add(path)
    pkgs, provides = installed_packages()
    allowed = closure([p for p in server_pkgs if p in pkgs], pkgs, provides)
    own = owners(sorted(found))
    outside = sorted(f"{p} ({'/'.join(sorted(own[p])) or 'no package'})" for p in found if not own[p] & allowed)
    check(found and not outside, f"{len(found)} files CMake found, all from the list or its Depends (outside: {outside})")


def main():
    global SERVER_FLAGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--server", help="recal-server, whose --helpfull lists the flags command lines may use")
    ap.add_argument("--sanitizer-build", action="store_true",
                    help="the binaries are a sanitizer build's: leave its runtimes (libasan, libtsan...) out")
    ap.add_argument("--api-binary", action="append", default=[],
                    help="one of the binaries that the api image holds too (repeat; default: recal-server, recalctl)")
    ap.add_argument("binaries", nargs="*",
                    help="what the worker image holds: recal-server, recal-worker, recalctl, librecal_engine.so")
    a = ap.parse_args()
    source = os.path.abspath(a.source)
    deploy = os.path.join(source, "deploy")
    runtime_pkgs = read_list(os.path.join(deploy, "runtime-packages.txt"))
    worker_pkgs = read_list(os.path.join(deploy, "runtime-packages-worker.txt"))
    server = a.server or next((b for b in a.binaries if os.path.basename(b) == "recal-server"), None)
    if check(server is not None and os.access(server, os.X_OK), f"recal-server to ask for its flags ({server})"):
        SERVER_FLAGS = server_flags(server)

    image = image_info(source)
    check_compose(deploy, image)
    targets = check_cluster_compose(deploy, image)
    check_prometheus(deploy)
    check_prometheus_cluster(deploy, targets)
    check_grafana(deploy)
    check_promtool(deploy)
    shared = set()
    cluster = load_yaml(os.path.join(deploy, "docker-compose.cluster.yml")) or {}
    for svc in (cluster.get("services") or {}).values():
        if str(svc.get("image", "")).startswith("recal-server"):
            blobs = last(flags_of(compose_argv(svc, image)), "blobs") or ""
            if blobs.startswith("file:"):
                shared.add(blobs[len("file:"):])
    check_dockerfile(source, runtime_pkgs, worker_pkgs, image, shared)
    check_entrypoint_script(source)
    if a.binaries:
        api = a.api_binary or [b for b in a.binaries if os.path.basename(b) in ("recal-server", "recalctl")]
        check_runtime_deps(api, a.binaries, runtime_pkgs, worker_pkgs, image, a.sanitizer_build)
    else:
        check(False, "(d) no binaries given")
    check_k8s(deploy, image)
    check_build_list(source)
    recalctl = next((b for b in a.binaries if os.path.basename(b) == "recalctl"), None)
    if server and recalctl:
        check_api_without_worker(server, recalctl)
    else:
        check(False, "(g) recal-server and recalctl are needed")

    print()
    if failures:
        print(f"check_deploy: FAILED, {len(failures)} check(s):")
        for f in failures:
            print("  - " + f.splitlines()[0])
        return 1
    print("check_deploy: all checks passed" + (f" ({', '.join(notes)})" if notes else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
