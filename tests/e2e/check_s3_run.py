#!/usr/bin/env python3
"""recal-run on data in a bucket: the same results, byte for byte, as on the same local files.

    .venv/bin/python tests/e2e/check_s3_run.py --bin build/bin/recal-run --fixtures build/fixtures

Starts moto_server (an S3-compatible server, from the machine's own Python; exits 77, which
ctest reports as skipped, where it is not installed) on loopback, puts fixture tensor files
and a small image folder into a bucket with plain HTTP PUTs, and runs recal-run on
npy:s3://..., safetensors:s3://...:a,b and images:s3://... and on the local copies: the
BatchNorm buffers must be identical bytes and the reports must agree. Then the failure
paths: a missing key and a missing bucket (exit 1 naming them), and credentials that are
not configured at all.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def put(url, body=b""):
    # Not urllib's default form content type: moto would parse the body as a form and hang.
    request = urllib.request.Request(url, data=body, method="PUT",
                                     headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(request, timeout=30) as response:
        if response.status != 200:
            raise RuntimeError("PUT %s: HTTP %d" % (url, response.status))


def make_images(folder):
    from PIL import Image
    import random

    rng = random.Random(7)
    for cls in ("cat", "dog"):
        os.makedirs(os.path.join(folder, cls))
        for i in range(5):
            pixels = bytes(rng.randrange(256) for _ in range(40 * 30 * 3))
            image = Image.frombytes("RGB", (40, 30), pixels)
            name = os.path.join(folder, cls, "%d.%s" % (i, "png" if i % 2 else "jpg"))
            image.save(name, quality=90) if name.endswith("jpg") else image.save(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--fixtures", required=True)
    args = ap.parse_args()

    moto = shutil.which("moto_server")
    if not moto:
        print("moto_server not installed: the S3 recal-run check is skipped")
        return SKIP
    tmp = tempfile.mkdtemp(prefix="recal-s3-run-")
    port = free_port()
    log = open(os.path.join(tmp, "moto.log"), "w")
    server = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = "http://127.0.0.1:%d" % port
    failures = []
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(endpoint + "/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("moto_server did not answer on %s" % endpoint)

        put(endpoint + "/calib")
        images = os.path.join(tmp, "images")
        make_images(images)
        local = {
            "data/resnet18.npy": os.path.join(args.fixtures, "data", "resnet18.npy"),
            "data/two_input.safetensors": os.path.join(args.fixtures, "data", "two_input.safetensors"),
        }
        for root, _, files in os.walk(images):
            for name in files:
                path = os.path.join(root, name)
                local["images/" + os.path.relpath(path, images)] = path
        for key, path in local.items():
            with open(path, "rb") as f:
                put("%s/calib/%s" % (endpoint, key), f.read())

        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                   AWS_SHARED_CREDENTIALS_FILE=os.path.join(tmp, "none"))
        models = os.path.join(args.fixtures, "models")
        norm = "?resize=36&crop=32&mean=0.485,0.456,0.406&std=0.229,0.224,0.225"
        cases = [
            ("resnet18.traced_eval.pt", "npy:%s", "data/resnet18.npy", "", 8),
            ("two_input.scripted_eval.pt", "safetensors:%s:a,b", "data/two_input.safetensors", "", 8),
            ("resnet18.scripted_eval.pt", "images:%s", "images/", norm, 4),
        ]

        def run(model, spec, out, extra=()):
            cmd = [args.bin, "--model", os.path.join(models, model), "--data", spec, "--out",
                   os.path.join(tmp, out + ".pt"), "--bn_out", os.path.join(tmp, out + ".safetensors"),
                   "--report", os.path.join(tmp, out + ".json"), "--threads", "1", "--s3_endpoint", endpoint]
            return subprocess.run(cmd + list(extra), env=env, capture_output=True, text=True, timeout=600)

        for model, pattern, key, query, batch in cases:
            local_path = images if key == "images/" else local[key]
            ran = {}
            for where, target in (("local", local_path), ("s3", "s3://calib/" + key)):
                p = run(model, pattern % target + query, where, ["--batch_size", str(batch)])
                if p.returncode != 0:
                    failures.append("%s on %s: exit %d: %s" % (model, where, p.returncode, p.stderr.strip()))
                ran[where] = p.returncode == 0
            if not all(ran.values()):
                continue
            with open(os.path.join(tmp, "local.safetensors"), "rb") as a, \
                 open(os.path.join(tmp, "s3.safetensors"), "rb") as b:
                if a.read() != b.read():
                    failures.append("%s: the buffers from %s differ from the local file's" % (model, key))
            with open(os.path.join(tmp, "local.json")) as a, open(os.path.join(tmp, "s3.json")) as b:
                ra, rb = json.load(a), json.load(b)
                for field in ("batches", "samples", "layers_recalibrated"):
                    if ra[field] != rb[field]:
                        failures.append("%s: report %s %s locally, %s from the bucket" % (model, field, ra[field], rb[field]))
            print("ok: %s from s3://calib/%s equals the local run" % (model, key))

        refusals = [
            ("npy:s3://calib/data/missing.npy", env, "data/missing.npy"),
            ("npy:s3://nobucket/data/resnet18.npy", env, "nobucket"),
            ("npy:s3://calib/../etc/passwd", env, "s3://"),
            ("npy:s3://calib/data/resnet18.npy",
             {k: v for k, v in env.items() if not k.startswith("AWS_ACCESS") and not k.startswith("AWS_SECRET")},
             "credentials"),
        ]
        for spec, run_env, named in refusals:
            cmd = [args.bin, "--model", os.path.join(models, "resnet18.traced_eval.pt"), "--data", spec,
                   "--out", os.path.join(tmp, "refused.pt"), "--s3_endpoint", endpoint]
            p = subprocess.run(cmd, env=run_env, capture_output=True, text=True, timeout=300)
            if p.returncode != 1 or named not in p.stderr or os.path.exists(os.path.join(tmp, "refused.pt")):
                failures.append("%s: expected exit 1 naming %r and no output, got exit %d: %s"
                                % (spec, named, p.returncode, p.stderr.strip()))
            else:
                print("ok: %s refused: %s" % (spec, p.stderr.strip().splitlines()[-1][:160]))
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    for failure in failures:
        print("FAIL:", failure)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
