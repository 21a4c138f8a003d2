#!/usr/bin/python3
"""Checks the deployment files without a Docker engine (issue 6).

  (a) deploy/docker-compose.yml, deploy/prometheus.yml and the Grafana provisioning parse
      and say what they must; every dashboard query names a Recal metric;
  (b) promtool check config deploy/prometheus.yml, if /usr/bin/promtool exists;
  (c) the Dockerfile's build stage installs scripts/debian-packages.txt through
      scripts/install-deps.sh, its runtime stage exactly deploy/runtime-packages.txt;
  (d) every library the given binaries load (ldd) belongs to a package of
      deploy/runtime-packages.txt or to one of their (recursive) Depends.

usage: check_deploy.py --source DIR BINARY...
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

METRICS = {
    "recal_jobs_queued", "recal_jobs_running", "recal_job_duration_seconds",
    "recal_samples_processed_total", "recal_jobs_finished_total", "grpc_server_handled_total",
}
SHUTDOWN_TIMEOUT_S = 20  # recal-server --shutdown_timeout_seconds default
OWN_LIBS = {"librecal_engine.so"}

failures = []
notes = []


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


# --------------------------------------------------------------------------- (a)
def check_compose(deploy):
    print("(a) docker-compose.yml")
    doc = load_yaml(os.path.join(deploy, "docker-compose.yml"))
    if doc is None:
        return
    services = doc.get("services") or {}
    for s in ("recal", "prometheus", "grafana"):
        check(s in services, f"service {s}")
    recal = services.get("recal") or {}
    build = recal.get("build")
    dockerfile = None
    if isinstance(build, dict):
        dockerfile = os.path.normpath(os.path.join(
            deploy, build.get("context", "."), build.get("dockerfile", "Dockerfile")))
    elif isinstance(build, str):
        dockerfile = os.path.normpath(os.path.join(deploy, build, "Dockerfile"))
    check(dockerfile is not None and os.path.isfile(dockerfile),
          f"recal builds from an existing Dockerfile ({dockerfile})")

    grace = seconds(recal.get("stop_grace_period", "10s"))
    check(grace is not None and grace > SHUTDOWN_TIMEOUT_S,
          f"recal stop_grace_period {recal.get('stop_grace_period')} > "
          f"--shutdown_timeout_seconds {SHUTDOWN_TIMEOUT_S}s")

    mounts = {}
    for v in recal.get("volumes") or []:
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
    data_dir = mounts.get("/var/lib/recal")
    check(data_dir is not None and data_dir[0] == "volume" and data_dir[1] in (doc.get("volumes") or {}),
          f"named volume at /var/lib/recal ({data_dir})")
    data = mounts.get("/data")
    check(data is not None and data[0] == "bind" and data[2],
          f"read-only bind mount at /data ({data})")

    # The server listens beyond loopback, so it must get its credentials: the secret the
    # Dockerfile's --auth_file=/run/secrets/recal_auth reads.
    secrets = recal.get("secrets") or []
    names = {s if isinstance(s, str) else s.get("source") for s in secrets}
    check("recal_auth" in names and "recal_auth" in (doc.get("secrets") or {}),
          f"recal gets the secret recal_auth ({sorted(n for n in names if n)})")
    ports = {str(p).split(":")[-1].split("/")[0] if not isinstance(p, dict) else str(p.get("target"))
             for p in recal.get("ports") or []}
    check({"50051", "9464"} <= ports, f"recal publishes 50051 and 9464 ({sorted(ports)})")

    prom = services.get("prometheus") or {}
    check(str(prom.get("image", "")).startswith("prom/prometheus"), "prometheus image prom/prometheus")
    check(any("prometheus.yml:/etc/prometheus/prometheus.yml" in str(v) for v in prom.get("volumes") or []),
          "prometheus mounts deploy/prometheus.yml")
    graf = services.get("grafana") or {}
    check(str(graf.get("image", "")).startswith("grafana/grafana"), "grafana image grafana/grafana")
    check(any(str(v).startswith("./grafana/provisioning:/etc/grafana/provisioning")
              for v in graf.get("volumes") or []), "grafana mounts deploy/grafana/provisioning")


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
              "prometheus.yml checked structurally only")
        notes.append("promtool skipped")
        return
    r = subprocess.run([promtool, "check", "config", os.path.join(deploy, "prometheus.yml")],
                       capture_output=True, text=True)
    check(r.returncode == 0, "promtool check config deploy/prometheus.yml" +
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


def check_dockerfile(source, runtime_pkgs):
    print("(c) Dockerfile")
    path = os.path.join(source, "Dockerfile")
    try:
        text = open(path).read()
    except OSError as e:
        check(False, f"Dockerfile: {e}")
        return
    stages = dockerfile_stages(text)
    check(len(stages) >= 2, f"multi-stage ({[s[0] for s in stages]})")
    check(all(base == "debian:bookworm-slim" for _, base, _ in stages), "every stage FROM debian:bookworm-slim")
    if len(stages) < 2:
        return
    build, runtime = stages[0][2], stages[-1][2]
    build_text, runtime_text = "\n".join(build), "\n".join(runtime)

    check(re.search(r"^COPY\s.*scripts/debian-packages\.txt", build_text, re.M) is not None
          and re.search(r"^COPY\s.*scripts/install-deps\.sh", build_text, re.M) is not None,
          "build stage COPYs scripts/debian-packages.txt and scripts/install-deps.sh")
    check(re.search(r"^RUN\s.*install-deps\.sh", build_text, re.M) is not None,
          "build stage RUNs scripts/install-deps.sh")
    check("apt-get install" not in build_text, "build stage has no apt-get install of its own")
    check("recal-server" in build_text and "recal-worker" in build_text and "recalctl" in build_text
          and "--preset default" in build_text,
          "build stage builds recal-server, recal-worker and recalctl with the default preset")

    copy_list = re.search(r"^COPY\s+(?!--from)\S*deploy/runtime-packages\.txt\s+(\S+)$", runtime_text, re.M)
    check(copy_list is not None, "runtime stage COPYs deploy/runtime-packages.txt")
    installs = [l for l in runtime if l.startswith("RUN") and "apt-get install" in l]
    check(len(installs) == 1, f"runtime stage has one apt-get install ({len(installs)})")
    if copy_list and installs:
        dest = copy_list.group(1)
        inst = installs[0]
        check(dest in inst.split("apt-get install", 1)[1], f"apt-get install reads {dest}")
        # Nothing but the file's packages: no package names written after install's options.
        args = inst.split("apt-get install", 1)[1]
        args = re.sub(r"\$\([^)]*\)", " ", args).split("&&")[0].split()
        extra = [a for a in args if not a.startswith("-")]
        check(not extra, f"apt-get install names no package of its own ({extra})")
    literal = [p for p in runtime_pkgs if re.search(r"(?<![\w.+-])" + re.escape(p) + r"(?![\w.+-])", text)]
    check(not literal, f"Dockerfile does not repeat the runtime list ({literal})")
    check(re.search(r"^COPY\s+--from=\S+\s.*librecal_engine\.so", runtime_text, re.M) is not None,
          "runtime stage copies librecal_engine.so")
    check(re.search(r"^COPY\s+--from=\S+\s.*recal-server.*\s", runtime_text, re.M) is not None
          and re.search(r"^COPY\s+--from=\S+\s.*recal-worker", runtime_text, re.M) is not None
          and re.search(r"^COPY\s+--from=\S+\s.*recalctl", runtime_text, re.M) is not None,
          "runtime stage copies recal-server, recal-worker (beside it) and recalctl")
    check(re.search(r"^USER\s+recal\b", runtime_text, re.M) is not None, "runs as user recal")
    expose = set()
    for l in runtime:
        if l.startswith("EXPOSE"):
            expose |= set(l.split()[1:])
    check({"50051", "9464"} <= expose, f"EXPOSE 50051 9464 ({sorted(expose)})")
    check(re.search(r"^VOLUME\s+\[?\"?/var/lib/recal", runtime_text, re.M) is not None, "VOLUME /var/lib/recal")
    check(re.search(r"^HEALTHCHECK\s.*CMD\s+recalctl\s+--server=localhost:50051\s+health", runtime_text, re.M)
          is not None, "HEALTHCHECK CMD recalctl --server=localhost:50051 health")
    ep = [l for l in runtime if l.startswith("ENTRYPOINT")]
    entry = json.loads(ep[-1][len("ENTRYPOINT"):]) if ep else []
    want = ["recal-server", "--data_dir=/var/lib/recal", "--data_root=/data",
            "--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", "--auth_file=/run/secrets/recal_auth"]
    check(entry[:1] == want[:1] and set(want[1:]) <= set(entry[1:]), f"ENTRYPOINT {entry}")


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


def check_runtime_deps(binaries, runtime_pkgs):
    print("(d) runtime libraries")
    if not shutil.which("dpkg-query") or not shutil.which("ldd"):
        check(False, "dpkg-query and ldd are needed")
        return
    pkgs, provides = installed_packages()
    absent = [p for p in runtime_pkgs if p not in pkgs]
    check(not absent, f"every runtime package is installed here, so its Depends are known ({absent})")
    allowed = closure([p for p in runtime_pkgs if p in pkgs], pkgs, provides)
    print(f"  note {len(runtime_pkgs)} runtime packages, {len(allowed)} with their Depends")
    libs = {}
    for b in binaries:
        found, missing = ldd(b)
        check(not missing, f"{os.path.basename(b)}: every library found ({missing})")
        libs.update({k: v for k, v in found.items() if k not in OWN_LIBS})
        print(f"  note {os.path.basename(b)}: {len(found)} libraries")
    own = owners(sorted(set(libs.values())))
    unowned = sorted(f"{k} ({v})" for k, v in libs.items() if not own[v])
    check(not unowned, f"every library belongs to a Debian package ({unowned})")
    outside = sorted(f"{k} ({'/'.join(sorted(own[v]))})" for k, v in libs.items()
                     if own[v] and not own[v] & allowed)
    check(not outside, f"{len(libs)} libraries, all from deploy/runtime-packages.txt or their "
                       f"Depends (outside: {outside})")
    direct = set()
    for v in libs.values():
        direct |= own[v]
    unused = [p for p in runtime_pkgs if p not in closure(direct & allowed, pkgs, provides)]
    if unused:
        print(f"  note listed but no library of these binaries comes from them: {unused}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("binaries", nargs="*", help="recal-server, recal-worker, recalctl, librecal_engine.so")
    a = ap.parse_args()
    source = os.path.abspath(a.source)
    deploy = os.path.join(source, "deploy")
    runtime_pkgs = read_list(os.path.join(deploy, "runtime-packages.txt"))

    check_compose(deploy)
    check_prometheus(deploy)
    check_grafana(deploy)
    check_promtool(deploy)
    check_dockerfile(source, runtime_pkgs)
    if a.binaries:
        check_runtime_deps(a.binaries, runtime_pkgs)
    else:
        check(False, "(d) no binaries given")

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
