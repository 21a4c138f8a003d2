#!/usr/bin/env python3
"""The main job through the service, the secure way: make a token (recalctl token new), start
recal-server with the auth file that admits it, upload a real torchvision
ResNet-18 (TorchScript), submit a job on data under the server's data root, follow its
events, download the recalibrated model, its BatchNorm buffers and the report, and check
them against the float64 reference. Python stubs are generated from proto/ with Debian's
protoc and grpc_python_plugin (until the Python client package lands).

    .venv/bin/python scripts/demo_server.py --server build/bin/recal-server \
        --fixtures build/fixtures --out demo-out
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def generate_stubs(out_dir):
    subprocess.run(["protoc", "-I", os.path.join(ROOT, "proto"), "--python_out", out_dir,
                    "--grpc_python_out", out_dir,
                    "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
                    "recal/v1/report.proto", "recal/v1/recal.proto"], check=True)
    sys.path.insert(0, out_dir)


def new_token(recalctl, auth_file):
    """A new token of tenant "demo" (role submit); its auth-file line written to `auth_file`."""
    made = json.loads(subprocess.run([recalctl, "token", "new", "--tenant", "demo", "--role", "submit",
                                      "--output", "json", "--quiet"],
                                     check=True, capture_output=True, text=True).stdout)
    with open(auth_file, "w") as f:
        f.write(made["auth_line"] + "\n")
    return made["token"]


def start_server(binary, data_dir, data_root, log_path, extra=()):
    log = open(log_path, "w")
    # No metrics endpoint: the default port would collide with any other server running.
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--metrics_listen=", "--data_dir=" + data_dir,
                             "--data_root=" + data_root, *extra], stderr=log)
    for _ in range(600):
        match = re.search(r"listening on port (\d+)", open(log_path).read())
        if match:
            return proc, int(match.group(1))
        if proc.poll() is not None:
            sys.exit("recal-server exited: " + open(log_path).read())
        time.sleep(0.1)
    sys.exit("recal-server did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=os.path.join(ROOT, "build", "bin", "recal-server"))
    ap.add_argument("--fixtures", default=os.path.join(ROOT, "build", "fixtures"))
    ap.add_argument("--out", default=os.path.join(ROOT, "demo-out"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="recal-demo-")
    generate_stubs(work)
    import grpc
    from recal.v1 import recal_pb2, recal_pb2_grpc

    # 1. A token for tenant "demo", and the auth-file line that admits it (the server keeps only its hash).
    auth_file = os.path.join(work, "auth.txt")
    token = new_token(os.path.join(os.path.dirname(args.server), "recalctl"), auth_file)
    # 2. The server, with credentials required.
    proc, port = start_server(args.server, os.path.join(work, "data"), args.fixtures,
                              os.path.join(work, "server.log"), ["--auth_file=" + auth_file])
    try:
        # 3. Calls that carry the token.
        metadata = (("authorization", "Bearer " + token),)
        stub = recal_pb2_grpc.RecalStub(grpc.insecure_channel("127.0.0.1:%d" % port))
        try:
            stub.ListJobs(recal_pb2.ListJobsRequest())
            sys.exit("the server answered a call without a token")
        except grpc.RpcError as error:
            print("without a token:", error.code().name)
        model_path = os.path.join(args.fixtures, "models", "resnet18.exported_eval.pt2")
        blob = open(model_path, "rb").read()

        def upload():
            yield recal_pb2.UploadModelRequest(header=recal_pb2.UploadHeader(
                name="resnet18", size=len(blob), sha256=hashlib.sha256(blob).hexdigest()))
            for offset in range(0, len(blob), 1 << 20):
                yield recal_pb2.UploadModelRequest(chunk=recal_pb2.UploadChunk(
                    offset=offset, data=blob[offset:offset + (1 << 20)]))

        model = stub.UploadModel(upload(), metadata=metadata)
        print("uploaded %s: %d BatchNorm layers" % (model.id, len(model.layers)))
        spec = recal_pb2.JobSpec(model_id=model.id, batch_size=8, data=recal_pb2.DataSource(
            tensor_file=recal_pb2.TensorFileSource(format=recal_pb2.TensorFileSource.NPY,
                                                   path="data/resnet18.npy")))
        job = stub.SubmitJob(recal_pb2.SubmitJobRequest(spec=spec, request_id="demo-1"), metadata=metadata)
        print("submitted", job.id)
        for event in stub.WatchJob(recal_pb2.WatchJobRequest(id=job.id), metadata=metadata):
            kind = event.WhichOneof("kind")
            if kind == "state":
                print("  #%d state %s" % (event.seq, recal_pb2.JobState.Name(event.state)))
            elif kind == "progress":
                print("  #%d batch %d/%d" % (event.seq, event.progress.batches_done,
                                             event.progress.batches_total))
            elif kind == "failure":
                sys.exit("job failed: " + event.failure.message)
        for artifact, name in ((recal_pb2.MODEL, "server.recalibrated.pt2"),
                               (recal_pb2.BN_BUFFERS, "server.bn.safetensors"),
                               (recal_pb2.REPORT, "server.report.json")):
            with open(os.path.join(args.out, name), "wb") as f:
                for chunk in stub.DownloadResult(recal_pb2.DownloadResultRequest(
                        job_id=job.id, artifact=artifact), metadata=metadata):
                    f.write(chunk.data)
        print("downloaded to", args.out)
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
    import safetensors_io
    import reference as reference_metric
    out = torch.export.load(os.path.join(args.out, "server.recalibrated.pt2"))
    reference = safetensors_io.load(os.path.join(args.fixtures, "ref", "resnet18.population.safetensors"))
    worst = reference_metric.worst_error(dict(out.state_dict), reference)
    print("recalibrated through the server; worst difference from the float64 reference: "
          "%.3f of the 1e-5 tolerance" % worst)
    return 0 if worst <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
