#!/usr/bin/env -S sh -c 'exec "$(dirname "$0")/../.venv/bin/python" "$0" "$@"'
"""recal-server on loopback: upload throughput, and a job's end-to-end time through the
server against recal-run on the same model, data and threads (interleaved, medians).

    .venv/bin/python bench/server_bench.py [--server build/bin/recal-server]
        [--run build/bin/recal-run] [--model_mb 120] [--batches 20] [--repeats 3]

Upload: a real TorchScript archive of about --model_mb MB (a Linear layer big enough, plus
BatchNorm), 1 MiB chunks, from Python's grpc client; the time runs from the first chunk to
the accepted model (digest verified, archive loaded and inspected).
Job: ResNet-18 (scripted), --batches batches of 32x3x112x112 (npy under the server's data
root), and a job of 1 batch (the fixed cost of a job), 2 intra-op threads on both sides;
through the server the time runs from SubmitJob to the last byte of the three downloaded
artifacts (the job runs in a sandboxed recal-worker process of its own); recal-run is timed
as a whole process.
"""
import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
import demo_server  # noqa: E402  (stub generation, server start)


def make_inputs(work, model_mb, batches):
    import numpy as np
    import torch
    import models

    class Big(torch.nn.Module):
        def __init__(self, features):
            super().__init__()
            self.fc = torch.nn.Linear(features, features)
            self.bn = torch.nn.BatchNorm1d(features)

        def forward(self, x):
            return self.bn(self.fc(x))

    features = int((model_mb * 1e6 / 4) ** 0.5)
    torch.jit.save(torch.jit.script(Big(features)), os.path.join(work, "big.pt"))
    resnet, _ = models.build("resnet18")
    torch.jit.save(torch.jit.script(resnet.eval()), os.path.join(work, "root", "resnet18.pt"))
    rng = np.random.default_rng(0)
    np.save(os.path.join(work, "root", "x.npy"),
            rng.standard_normal((batches * 32, 3, 112, 112), dtype=np.float32))


def upload(stub, pb, path):
    blob = open(path, "rb").read()
    digest = hashlib.sha256(blob).hexdigest()

    def messages():
        yield pb.UploadModelRequest(header=pb.UploadHeader(name=os.path.basename(path),
                                                           size=len(blob), sha256=digest))
        for offset in range(0, len(blob), 1 << 20):
            yield pb.UploadModelRequest(chunk=pb.UploadChunk(offset=offset,
                                                             data=blob[offset:offset + (1 << 20)]))

    start = time.perf_counter()
    model = stub.UploadModel(messages())
    return model, len(blob), time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=os.path.join(ROOT, "build", "bin", "recal-server"))
    ap.add_argument("--run", default=os.path.join(ROOT, "build", "bin", "recal-run"))
    ap.add_argument("--model_mb", type=float, default=120)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="recal-bench-")
    os.makedirs(os.path.join(work, "root"))
    make_inputs(work, args.model_mb, args.batches)
    demo_server.generate_stubs(work)
    import grpc
    from recal.v1 import recal_pb2 as pb, recal_pb2_grpc

    proc, port = demo_server.start_server(args.server, os.path.join(work, "data"),
                                          os.path.join(work, "root"), os.path.join(work, "server.log"),
                                          extra=["--threads_per_worker=2"])
    try:
        stub = recal_pb2_grpc.RecalStub(grpc.insecure_channel(
            "127.0.0.1:%d" % port, options=[("grpc.max_receive_message_length", 64 << 20)]))
        _, size, seconds = upload(stub, pb, os.path.join(work, "big.pt"))
        print("upload: %.1f MB in 1 MiB chunks in %.2f s = %.0f MB/s (digest verified, archive "
              "inspected)" % (size / 1e6, seconds, size / 1e6 / seconds))
        model, _, _ = upload(stub, pb, os.path.join(work, "root", "resnet18.pt"))
        def through_server(max_batches):
            spec = pb.JobSpec(model_id=model.id, batch_size=32, data=pb.DataSource(
                tensor_file=pb.TensorFileSource(format=pb.TensorFileSource.NPY, path="x.npy")),
                options=pb.EngineOptions(max_batches=max_batches))
            start = time.perf_counter()
            job = stub.SubmitJob(pb.SubmitJobRequest(spec=spec))
            for event in stub.WatchJob(pb.WatchJobRequest(id=job.id)):
                if event.WhichOneof("kind") == "failure":
                    sys.exit("job failed: " + event.failure.message)
            for artifact in (pb.MODEL, pb.BN_BUFFERS, pb.REPORT):
                for _ in stub.DownloadResult(pb.DownloadResultRequest(job_id=job.id, artifact=artifact)):
                    pass
            return time.perf_counter() - start

        def recal_run(max_batches):
            start = time.perf_counter()
            subprocess.run([args.run, "--model", os.path.join(work, "root", "resnet18.pt"),
                            "--data", "npy:" + os.path.join(work, "root", "x.npy"), "--batch_size", "32",
                            "--threads", "2", "--out", os.path.join(work, "out.pt"),
                            "--bn_out", os.path.join(work, "bn.safetensors"),
                            "--report", os.path.join(work, "report.json"),
                            "--max_batches", str(max_batches)],
                           check=True, stderr=subprocess.DEVNULL)
            return time.perf_counter() - start

        times = {key: [] for key in ("server", "run", "server1", "run1")}
        for i in range(args.repeats + 1):  # the first of each is a warm-up
            # Interleaved, so that the machine's drift hits both sides alike.
            sample = {"server": through_server(args.batches), "run": recal_run(args.batches),
                      "server1": through_server(1), "run1": recal_run(1)}
            if i > 0:
                for key, value in sample.items():
                    times[key].append(value)
        m = {key: statistics.median(values) for key, values in times.items()}
        print("job, ResNet-18 on 32x3x112x112 batches, 2 threads (median of %d):" % args.repeats)
        print("| path                                   | %2d batches | 1 batch |" % args.batches)
        print("|----------------------------------------|------------|---------|")
        print("| recal-server: submit .. downloaded     | %8.2f s | %5.2f s |" % (m["server"], m["server1"]))
        print("| recal-run: whole process               | %8.2f s | %5.2f s |" % (m["run"], m["run1"]))
        print("ratio server / recal-run: %.3f (%d batches), %.3f (1 batch)" % (
            m["server"] / m["run"], args.batches, m["server1"] / m["run1"]))
        print("fixed cost of a job through the server (1-batch job: worker start, sandbox, load, "
              "validation, rewrite, save, reload, store): %.0f ms" % (1000 * m["server1"]))
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
