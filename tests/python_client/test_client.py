"""The Python client package (client/python/recal) against the real recal-server.

Run by ctest (tests/python_client/CMakeLists.txt) as
    PYTHONPATH=client/python .venv/bin/python -m unittest -v test_client
with RECAL_SERVER_BIN and RECAL_FIXTURES_DIR set; by hand they default to build/.
"""

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import zipfile
from unittest import mock

import grpc
import numpy as np
from google.protobuf import json_format

import recal
from recal import recal_pb2, report_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER_BIN = os.environ.get("RECAL_SERVER_BIN", os.path.join(ROOT, "build", "bin", "recal-server"))
FIXTURES = os.environ.get("RECAL_FIXTURES_DIR", os.path.join(ROOT, "build", "fixtures"))
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
import image_folders  # noqa: E402
import safetensors_io  # noqa: E402

RESNET = os.path.join(FIXTURES, "models", "resnet18.traced_eval.pt")
MOBILENET = os.path.join(FIXTURES, "models", "mobilenet_v2.traced_eval.pt")
RESNET_DATA = "npy:data/resnet18.npy"  # relative to the server's data root
# Programs whose input contract data can break (tests/fixtures/contract_programs.py).
CONTRACT = os.environ.get("RECAL_CONTRACT_DIR", os.path.join(ROOT, "build", "contract_programs"))
MiB = 1 << 20


class Server:
    """recal-server on loopback with its own data dir, authentication on (self.token is an
    admin of the tenant "default"; `auth_lines` go into the auth file too, e.g. a tenant's
    quotas); restartable on the same port."""

    def __init__(self, data_dir, data_roots=(FIXTURES,), flags=(), auth_lines=()):
        self.data_dir = data_dir
        self.flags = list(flags)
        self.data_roots = ",".join(data_roots)
        self.token = "recal_" + secrets.token_hex(32)
        self.auth_file = data_dir + ".auth"
        with open(self.auth_file, "w") as f:
            f.write("token-sha256:%s tenant=default role=admin\n"
                    % hashlib.sha256(self.token.encode()).hexdigest())
            f.writelines(line + "\n" for line in auth_lines)
        self.proc = None
        self.port = 0
        self.starts = 0
        self.start()

    def start(self):
        self.starts += 1
        log_path = os.path.join(os.path.dirname(self.data_dir), "server.%d.log" % self.starts)
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                [SERVER_BIN, "--listen=127.0.0.1:%d" % self.port, "--data_dir=" + self.data_dir,
                 "--data_root=" + self.data_roots, "--metrics_listen=", "--auth_file=" + self.auth_file,
                 *self.flags],
                stderr=log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with open(log_path) as f:
                match = re.search(r"listening on port (\d+)", f.read())
            if match:
                self.port = int(match.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        with open(log_path) as f:
            raise RuntimeError("recal-server did not start:\n" + f.read())

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def kill(self):
        self.proc.kill()  # SIGKILL: no chance to tidy up
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


class FakeRpcError(grpc.RpcError):
    """What grpc raises when the connection breaks in the middle of a call."""

    def __init__(self, code=grpc.StatusCode.UNAVAILABLE, details="Socket closed"):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class _BrokenStream:
    """A streaming call that yields `count` items of `inner`, then fails as a lost connection."""

    def __init__(self, inner, count):
        self.inner, self.count = inner, count

    def __iter__(self):
        for i, item in enumerate(self.inner):
            if i == self.count:
                self.inner.cancel()
                raise FakeRpcError()
            yield item

    def cancel(self):
        self.inner.cancel()


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _kinds(events):
    return [e.WhichOneof("kind") for e in events]


def _states(events):
    return [recal_pb2.JobState.Name(e.state) for e in events if e.WhichOneof("kind") == "state"]


def _assert_consecutive(test, events, after_seq=0):
    """One snapshot first (seq = after_seq), then seqs after_seq+1, after_seq+2, ..."""
    test.assertEqual(events[0].WhichOneof("kind"), "snapshot")
    test.assertEqual(events[0].seq, after_seq)
    test.assertEqual(_kinds(events[1:]).count("snapshot"), 0)
    test.assertEqual([e.seq for e in events[1:]], list(range(after_seq + 1, after_seq + len(events))))


def _worst_reference_error(bn, family="resnet18", which="population"):
    """max over channels of |Δvar|/var and |Δmean|/max(|mean|, std) against the float64
    reference for the family (ResNet-18 on data/resnet18.npy by default; `which`: the
    reference file's estimator part, "population.iterations2" for two passes)."""
    reference = safetensors_io.load(os.path.join(FIXTURES, "ref", "%s.%s.safetensors" % (family, which)),
                                    as_numpy=True)
    worst = 0.0
    for key, ref in reference.items():
        got = np.asarray(bn[key], dtype=np.float64)
        if key.endswith("running_var"):
            scale = ref
        else:
            scale = np.maximum(np.abs(ref), np.sqrt(reference[key[: -len("mean")] + "var"]))
        worst = max(worst, float((np.abs(got - ref) / scale).max()))
    return worst


def _edit_program(source, dest, which, target):
    """Copies the PT2 archive `source` to `dest` with the target of the first node `which`
    picks replaced by `target`, as an attacker would edit it."""
    import zipfile

    with zipfile.ZipFile(source) as src, zipfile.ZipFile(dest, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            if "/models/" in info.filename and info.filename.endswith(".json"):
                program = json.loads(data)
                node = next(n for n in program["graph_module"]["graph"]["nodes"] if which(n))
                node["target"] = target
                data = json.dumps(program).encode()
            out.writestr(info, data)


class ClientTest(unittest.TestCase):
    """One server for most tests (one CPU worker: jobs run one at a time)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="recal-pyclient-")
        image_folders.make(cls.tmp)  # root/imgs, root/with_bad, outside/imgs
        cls.server = Server(os.path.join(cls.tmp, "data"), (FIXTURES, os.path.join(cls.tmp, "root")))
        cls.client = recal.Client(cls.server.address, token=cls.server.token, timeout=30)
        cls.model = cls.client.upload_model(RESNET)
        cls._done = None

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=self.tmp)

    def done_job(self):
        """A SUCCEEDED ResNet-18 job on the fixture data (made once)."""
        if ClientTest._done is None:
            job = self.client.submit(self.model, RESNET_DATA, batch_size=8)
            ClientTest._done = self.client.wait(job)
            self.assertEqual(ClientTest._done.state, recal.SUCCEEDED, ClientTest._done.error.message)
        return ClientTest._done

    def wrap(self, name, wrapper):
        """Replaces client.stub.NAME by wrapper(original) for this test."""
        original = getattr(self.client.stub, name)
        setattr(self.client.stub, name, wrapper(original))
        self.addCleanup(setattr, self.client.stub, name, original)

    # -------------------------------------------------------------------------- upload

    def test_upload_returns_the_content_addressed_model_and_skips_known_ones(self):
        self.assertEqual(self.model.id, "sha256:" + _sha256(RESNET))
        self.assertEqual(self.model.name, "resnet18.traced_eval.pt")
        self.assertEqual(len(self.model.layers), 20)
        calls = []
        self.wrap("UploadModel", lambda f: lambda *a, **k: calls.append(1) or f(*a, **k))
        again = self.client.upload_model(RESNET, name="another name")
        self.assertEqual(calls, [], "a known model is not sent again")
        self.assertEqual(again.id, self.model.id)
        self.assertIn(self.model.id, [m.id for m in self.client.list_models()])

    def test_a_file_the_server_would_refuse_is_refused_before_any_byte_is_sent(self):
        """recal.archive reads the zip's records as the server does (a torch.save'd
        state_dict: data.pkl only); the upload is refused before GetModel or UploadModel."""
        calls = []
        for name in ("GetModel", "UploadModel", "GetUploadStatus"):
            self.wrap(name, lambda f, name=name: lambda *a, **k: calls.append(name) or f(*a, **k))
        state_dict = os.path.join(self.dir, "weights.pt")
        with zipfile.ZipFile(state_dict, "w") as z:  # what torch.save(model.state_dict()) writes
            for record in ("data.pkl", ".format_version", "byteorder", "data/0", "version"):
                z.writestr("weights/" + record, b"\x80\x02}q\x00.")
        pickled = os.path.join(self.dir, "model.pkl")
        with open(pickled, "wb") as f:
            f.write(b"\x80\x04\x95" + bytes(64))
        other_zip = os.path.join(self.dir, "notes.zip")
        with zipfile.ZipFile(other_zip, "w") as z:
            z.writestr("notes/readme.txt", "hello")
        for path, why in ((state_dict, "a torch.save file (a state_dict or a pickled module), not a model program"),
                          (pickled, "not a model archive (not a zip file"),
                          (other_zip, "a zip file but not a model archive")):
            with self.assertRaises(recal.RecalError) as caught:
                self.client.upload_model(path)
            self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertTrue(caught.exception.message.startswith("%s: %s" % (path, why)), caught.exception.message)
            self.assertIn("torch.export.save(torch.export.export(model, example_inputs), 'model.pt2')",
                          caught.exception.message)
            self.assertTrue(caught.exception.message.endswith("; nothing was sent"), caught.exception.message)
        self.assertEqual(calls, [])
        # Both formats the server takes pass the same reading.
        self.assertEqual(recal.archive.model_format(RESNET), "torchscript")
        exported = os.path.join(FIXTURES, "models", "resnet18.exported_train.pt2")
        self.assertEqual(recal.archive.model_format(exported), "exported_program")

    def test_float64_data_for_a_float32_program_is_cast_once_noted_and_keeps_the_fast_layout(self):
        """MobileNetV2 (depthwise: channels-last where its data is float32) on the same samples
        as float32 and as float64: the float64 job says once, in its report, that it casts, and
        runs in the same layout. int64 data is refused at submit with the fix."""
        source = np.load(os.path.join(FIXTURES, "data", "mobilenet_v2.npy"))[:8]
        root = os.path.join(self.tmp, "root")
        for dtype in ("float32", "float64", "int64"):
            np.save(os.path.join(root, "mnv2_%s.npy" % dtype), source.astype(dtype))
        program = os.path.join(FIXTURES, "models", "mobilenet_v2.exported_eval.pt2")
        reports = {}
        for dtype in ("float32", "float64"):
            path = os.path.join(self.dir, dtype + ".json")
            self.client.recalibrate(program, data="npy:%s/mnv2_%s.npy" % (root, dtype), batch_size=4, report=path)
            reports[dtype] = recal.read_report(path)
        self.assertEqual(list(reports["float32"].notes), [])
        notes = list(reports["float64"].notes)
        self.assertEqual(len(notes), 1, notes)  # two batches, one note
        self.assertRegex(notes[0], r"^input '\w+': float64 data is cast to float32, the dtype the program was "
                                   r"exported with$")
        self.assertEqual(reports["float32"].memory_format, "channels_last")
        self.assertEqual(reports["float64"].memory_format, "channels_last")
        with self.assertRaises(recal.RecalError) as caught:
            self.client.submit(self.client.upload_model(program), "npy:%s/mnv2_int64.npy" % root, batch_size=4)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("is int64, but the program takes float32", caught.exception.message)
        self.assertIn("scale=255", caught.exception.message)
        self.assertIn("x.astype(np.float32)", caught.exception.message)

    def test_upload_resumes_from_the_committed_size(self):
        # Break an upload off by hand after two chunks have been committed.
        with open(MOBILENET, "rb") as f:
            blob = f.read()
        digest = hashlib.sha256(blob).hexdigest()

        def broken():
            yield recal_pb2.UploadModelRequest(header=recal_pb2.UploadHeader(
                name="mobilenet", size=len(blob), sha256=digest))
            for offset in (0, MiB):
                yield recal_pb2.UploadModelRequest(chunk=recal_pb2.UploadChunk(
                    offset=offset, data=blob[offset:offset + MiB]))
            deadline = time.monotonic() + 10
            while (self.client.stub.GetUploadStatus(recal_pb2.GetUploadStatusRequest(sha256=digest))
                   .committed_size < 2 * MiB and time.monotonic() < deadline):
                time.sleep(0.02)
            raise ConnectionAbortedError("the client went away")

        with self.assertRaises(grpc.RpcError):
            self.client.stub.UploadModel(broken())
        offsets = []

        def recording(upload):
            def call(requests, **kwargs):
                def seen():
                    for request in requests:
                        if request.HasField("chunk"):
                            offsets.append(request.chunk.offset)
                        yield request
                return upload(seen(), **kwargs)
            return call

        self.wrap("UploadModel", recording)
        model = self.client.upload_model(MOBILENET, labels={"arch": "mobilenet_v2"})
        self.assertEqual(model.id, "sha256:" + digest)
        self.assertEqual(dict(model.labels), {"arch": "mobilenet_v2"})
        self.assertEqual(offsets[0], 2 * MiB, "resumed where the server's upload stood")
        self.assertEqual(offsets, list(range(2 * MiB, len(blob), MiB)))

    # ---------------------------------------------------------------------------- jobs

    def test_submit_get_list_cancel(self):
        # A long job keeps the one worker busy, so the second one stays queued.
        running = self.client.submit(self.model, "synthetic:3x64x64", batch_size=8, max_batches=200)
        queued = self.client.submit(self.model.id, "synthetic:3x32x32,seed=7", batch_size=4,
                                    priority=-1, estimator="batch_average", modules="train",
                                    include="layer", exclude="^layer4", max_batches=3,
                                    allow_short_data=True, target_rel_error=0.5,
                                    labels={"who": "test"}, timeout_seconds=100)
        spec = self.client.get(queued.id).spec
        self.assertEqual(spec.data.synthetic.sample_shape, [3, 32, 32])
        self.assertEqual(spec.data.synthetic.seed, 7)
        self.assertEqual(spec.options.estimator, recal.report_pb2.BATCH_AVERAGE)
        self.assertEqual(spec.options.modules, recal.report_pb2.TRAIN)
        self.assertEqual((spec.options.include, spec.options.exclude), ("layer", "^layer4"))
        self.assertEqual((spec.options.max_batches, spec.options.allow_short_data,
                          spec.options.target_rel_error), (3, True, 0.5))
        self.assertEqual((spec.priority, spec.timeout_seconds, dict(spec.labels)),
                         (-1, 100.0, {"who": "test"}))
        self.assertEqual(len(queued.request_id), 32, "a generated uuid4")

        self.assertIn(queued.id, [j.id for j in self.client.list(["queued"])])
        self.assertNotIn(queued.id, [j.id for j in self.client.list(recal.SUCCEEDED)])
        both = [j.id for j in self.client.list(["QUEUED", recal.RUNNING])]
        self.assertIn(queued.id, both)
        self.assertIn(running.id, both)
        waiting = self.client.get(queued)
        self.assertEqual(waiting.state, recal.QUEUED)
        # Why it waits: behind the running job (or, were it not claimed yet, the job ahead).
        self.assertIn(waiting.wait.cause, (recal_pb2.JobWait.NEXT_IN_LINE, recal_pb2.JobWait.JOBS_AHEAD))
        self.assertRegex(waiting.wait.reason, r"^(it is next in line|1 job is ahead of it)")

        self.assertEqual(self.client.cancel(queued.id).state, recal.CANCELLED)
        self.client.cancel(running)
        final = self.client.wait(running.id)
        self.assertEqual(final.state, recal.CANCELLED)
        with self.assertRaises(recal.RecalError) as caught:
            self.client.download(final, os.path.join(self.dir, "x.pt"))
        self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("CANCELLED", caught.exception.message)

    def test_delete_job_refuses_until_it_ended_and_usage_adds_up(self):
        usage = self.client.usage()
        self.assertGreaterEqual(usage.models, 1)
        self.assertEqual(usage.stored_bytes, usage.model_bytes + usage.result_bytes + usage.reserved_bytes)
        job = self.client.submit(self.model, "synthetic:3x64x64", batch_size=8, max_batches=200)
        with self.assertRaises(recal.RecalError) as caught:
            self.client.delete_job(job)
        self.assertEqual(caught.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn("cancel it first", caught.exception.message)
        self.client.cancel(job)
        self.client.wait(job)
        deleted = self.client.delete_job(job.id)
        self.assertEqual(deleted.job.id, job.id)
        with self.assertRaises(recal.RecalError) as caught:
            self.client.get(job)
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_submit_retries_unavailable_with_the_same_request_id(self):
        attempts = []

        def flaky(submit):
            def call(request, **kwargs):
                attempts.append(request.request_id)
                if len(attempts) == 1:
                    submit(request, **kwargs)  # the server made the job, the answer got lost
                    raise FakeRpcError()
                return submit(request, **kwargs)
            return call

        self.wrap("SubmitJob", flaky)
        job = self.client.submit(self.model, RESNET_DATA, batch_size=8)
        self.assertEqual(len(attempts), 2)
        self.assertEqual(attempts[0], attempts[1])
        self.assertEqual([j.id for j in self.client.list() if j.request_id == attempts[0]], [job.id])
        same = self.client.submit(self.model, RESNET_DATA, batch_size=8, request_id=attempts[0])
        self.assertEqual(same.id, job.id, "idempotent on request_id")
        self.client.cancel(job)

    # --------------------------------------------------------------------------- watch

    def test_watch_then_resume_from_a_seq(self):
        job = self.client.submit(self.model, RESNET_DATA, batch_size=8)
        events = list(self.client.watch(job.id))
        _assert_consecutive(self, events)
        self.assertEqual(_states(events), ["QUEUED", "RUNNING", "SUCCEEDED"])
        self.assertEqual(events[-2].WhichOneof("kind"), "summary")
        self.assertEqual(events[-2].summary.layers_recalibrated, 20)
        # From a seq: a snapshot of the job as it is now, then exactly the events after it.
        tail = list(self.client.watch(job, after_seq=events[2].seq))
        _assert_consecutive(self, tail, after_seq=events[2].seq)
        self.assertEqual(tail[0].snapshot.state, recal.SUCCEEDED)
        self.assertEqual(tail[1:], events[3:])
        # After the last event: only the snapshot.
        self.assertEqual(_kinds(self.client.watch(job, after_seq=events[-1].seq)), ["snapshot"])

    def test_watch_continues_after_a_broken_stream(self):
        calls = []

        def breaking(watch):
            def call(request, **kwargs):
                calls.append(request.after_seq)
                stream = watch(request, **kwargs)
                return _BrokenStream(stream, 3) if len(calls) <= 2 else stream
            return call

        self.wrap("WatchJob", breaking)
        job = self.client.submit(self.model, RESNET_DATA, batch_size=8)
        progress = []
        final = self.client.wait(job, on_progress=progress.append)
        self.assertEqual(final.state, recal.SUCCEEDED)
        self.assertEqual(calls[:3], [0, 2, 4], "each watch resumes after the last seq it saw")
        self.assertTrue(progress and all(isinstance(p, recal_pb2.JobProgress) for p in progress))
        self.assertEqual(progress[-1].batches_done, 3)
        del calls[:]
        events = list(self.client.watch(job))
        _assert_consecutive(self, events)
        self.assertEqual(_states(events), ["QUEUED", "RUNNING", "SUCCEEDED"])

    def test_watch_gives_up_after_reconnect_seconds(self):
        with recal.Client("127.0.0.1:1", reconnect_seconds=0.5) as nowhere:
            start = time.monotonic()
            with self.assertRaises(recal.RecalError) as caught:
                list(nowhere.watch("job-1"))
            self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertLess(time.monotonic() - start, 10)

    # ------------------------------------------------------------------------ download

    def test_download_verifies_and_resumes(self):
        job = self.done_job()
        whole = os.path.join(self.dir, "whole.pt")
        digest = self.client.download(job.id, whole)
        self.assertEqual(digest, _sha256(whole))
        self.assertFalse(os.path.exists(whole + ".part"))
        size = os.path.getsize(whole)
        self.assertGreater(size, 4 * MiB)
        offsets = []
        breaks = [True]

        def recording(download):
            def call(request, **kwargs):
                offsets.append(request.offset)
                stream = download(request, **kwargs)
                return _BrokenStream(stream, 2) if breaks and breaks.pop() else stream
            return call

        # A stream that breaks after two chunks is resumed from where it broke.
        self.wrap("DownloadResult", recording)
        path = os.path.join(self.dir, "broken.pt")
        self.assertEqual(self.client.download(job, path), digest)
        self.assertEqual(offsets, [0, 2 * MiB])
        self.assertEqual(_sha256(path), digest)

        # A download broken off earlier (PATH.part) continues from the part's size.
        path = os.path.join(self.dir, "resumed.pt")
        with open(whole, "rb") as f, open(path + ".part", "wb") as part:
            part.write(f.read(3 * MiB + 17))
        del offsets[:]
        self.assertEqual(self.client.download(job, path), digest)
        self.assertEqual(offsets, [3 * MiB + 17])
        self.assertEqual(_sha256(path), digest)
        self.assertFalse(os.path.exists(path + ".part"))

        # A foreign or stale PATH.part: caught by the digest, downloaded again whole.
        with open(path + ".part", "wb") as part:
            part.write(b"not the model" * 1000)
        del offsets[:]
        self.assertEqual(self.client.download(job, path), digest)
        self.assertEqual(offsets, [13000, 0])
        self.assertEqual(_sha256(path), digest)
        # Longer than the artifact (OUT_OF_RANGE): the same.
        with open(path + ".part", "wb") as part:
            part.write(b"\0" * (size + 1))
        del offsets[:]
        self.assertEqual(self.client.download(job, path), digest)
        self.assertEqual(offsets, [size + 1, 0])

        # The other artifacts.
        report = os.path.join(self.dir, "report.json")
        self.client.download(job, report, artifact="report")
        with open(report) as f:
            self.assertEqual(json.load(f)["layers_recalibrated"], 20)  # int64: a JSON number
        bn = os.path.join(self.dir, "bn.safetensors")
        self.client.download(job, bn, artifact="bn")
        self.assertLessEqual(_worst_reference_error(safetensors_io.load(bn, as_numpy=True)), 1e-5)

    # --------------------------------------------------------------------- all in one

    def test_recalibrate_matches_the_float64_reference(self):
        out, bn_out, report = (os.path.join(self.dir, n) for n in ("out.pt", "bn.safetensors", "r.json"))
        progress = []
        job = self.client.recalibrate(RESNET, data=RESNET_DATA, out=out, bn_out=bn_out, report=report,
                                      batch_size=8, on_progress=progress.append)
        self.assertEqual(job.state, recal.SUCCEEDED)
        self.assertEqual(job.spec.batch_size, 8)
        self.assertEqual(job.progress.samples_done, 20)
        self.assertTrue(progress)
        bn = safetensors_io.load(bn_out, as_numpy=True)
        worst = _worst_reference_error(bn)
        print("\nrecalibrate(): worst relative difference from the float64 reference: %.2e" % worst)
        self.assertLessEqual(worst, 1e-5)
        # The report recalibrate() writes: the server's artifact with ints as ints.
        raw = os.path.join(self.dir, "raw.json")
        self.client.download(job, raw, artifact="report")
        with open(report) as f, open(raw) as g:
            written, artifact = json.load(f), json.load(g)
        self.assertEqual((written["batches"], written["samples"], written["layers"][0]["channels"]), (3, 20, 64))
        self.assertEqual(written["estimator"], "POPULATION")
        self.assertEqual(artifact["batches"], 3)  # the server's own JSON: int64 as numbers too
        self.assertEqual(written, recal.to_dict(recal.read_report(raw)))
        import torch  # the recalibrated archive loads and holds the same statistics

        buffers = dict(torch.jit.load(out).named_buffers())
        for key, value in bn.items():
            np.testing.assert_array_equal(buffers[key].numpy(), value, err_msg=key)

    def test_exported_programs_are_recalibrated_and_come_back_as_pt2(self):
        import torch

        # ResNet-18 from the training IR and from core ATen IR; a float64 HRNet (timm, which
        # torch.jit.script cannot capture) exported in train mode.
        for family, variant, batch_size in (("resnet18", "exported_train", 8), ("resnet18", "exported_core_eval", 8),
                                            ("zoo_hrnet_w18_small", "exported_train", 4)):
            model = os.path.join(FIXTURES, "models", "%s.%s.pt2" % (family, variant))
            out, bn_out, report = (os.path.join(self.dir, family + variant + n) for n in (".pt2", ".safetensors", ".json"))
            job = self.client.recalibrate(model, data="npy:data/%s.npy" % family, out=out, bn_out=bn_out, report=report,
                                          batch_size=batch_size)
            self.assertEqual(job.state, recal.SUCCEEDED, job.error.message)
            bn = safetensors_io.load(bn_out, as_numpy=True)
            self.assertLessEqual(_worst_reference_error(bn, family), 1e-5, variant)
            with open(report) as f:
                self.assertEqual(json.load(f)["model_format"], "exported_program")
            state = torch.export.load(out).state_dict
            for key, value in bn.items():
                np.testing.assert_array_equal(state[key].numpy(), value, err_msg=key)

    def test_folded_out_downloads_the_eval_mode_program_folded(self):
        import torch

        import exported_programs  # tests/fixtures

        model = os.path.join(FIXTURES, "models", "resnet18.exported_train.pt2")
        out, folded, report = (os.path.join(self.dir, "fold" + n) for n in (".pt2", ".folded.pt2", ".json"))
        job = self.client.recalibrate(model, data="npy:data/resnet18.npy", out=out, folded_out=folded, report=report,
                                      batch_size=8)
        self.assertEqual(job.state, recal.SUCCEEDED, job.error.message)
        with open(report) as f:
            self.assertEqual(len(json.load(f)["fold"]["folded"]), 20)
        program = torch.export.load(folded)
        self.assertEqual(exported_programs.bn_calls(program.graph), [])
        x = torch.randn(2, 3, 64, 64)  # the fixture's static resolution
        want = exported_programs.eval_module(torch.export.load(out))(x)
        self.assertLess(((program.module()(x) - want).abs().max() / want.abs().max()).item(), 1e-4)
        # The artifact by name, and a job that did not ask for it.
        self.client.download(job, os.path.join(self.dir, "again.pt2"), "folded")
        plain = self.client.recalibrate(model, data="npy:data/resnet18.npy", batch_size=8)
        with self.assertRaisesRegex(recal.RecalError, "fold_batch_norm"):
            self.client.download(plain, os.path.join(self.dir, "none.pt2"), "folded")

    def test_quantization_aware_programs_run_with_their_quantizers_held_and_iterate(self):
        import torch
        import torch.ao.quantization.fx._decomposed  # noqa: F401  (torch.export.load needs quantized_decomposed)

        # torch.ao's FX QAT and torchao's pt2e after convert_pt2e: the observers stay as they
        # were uploaded, every buffer but the running statistics comes back byte for byte.
        for family, variant in (("qat_fx", "exported_train"), ("qat_pt2e_converted", "exported_eval")):
            model = os.path.join(FIXTURES, "models", "%s.%s.pt2" % (family, variant))
            out, bn_out, report = (os.path.join(self.dir, family + n) for n in (".pt2", ".safetensors", ".json"))
            job = self.client.recalibrate(model, data="npy:data/%s.npy" % family, out=out, bn_out=bn_out,
                                          report=report, batch_size=12)
            self.assertEqual(job.state, recal.SUCCEEDED, job.error.message)
            self.assertLessEqual(_worst_reference_error(safetensors_io.load(bn_out, as_numpy=True), family), 1e-5)
            with open(report) as f:
                quantizers = json.load(f)["quantizers"]
            self.assertGreater(quantizers["count"], 0)
            uploaded, result = torch.export.load(model).state_dict, torch.export.load(out).state_dict
            for key, value in uploaded.items():
                if not key.endswith(("running_mean", "running_var")):
                    self.assertEqual(result[key].dtype, value.dtype, key)
                    self.assertTrue(torch.equal(result[key], value), key)
        # Two passes, the second on the statistics of the first (the QAT ConvBn reads them).
        model = os.path.join(FIXTURES, "models", "qat_fx.exported_train.pt2")
        bn_out, report = os.path.join(self.dir, "two.safetensors"), os.path.join(self.dir, "two.json")
        job = self.client.recalibrate(model, data="npy:data/qat_fx.npy", bn_out=bn_out, report=report,
                                      batch_size=12, iterations=2)
        self.assertEqual(job.state, recal.SUCCEEDED, job.error.message)
        bn = safetensors_io.load(bn_out, as_numpy=True)
        self.assertLessEqual(_worst_reference_error(bn, "qat_fx", "population.iterations2"), 1e-5)
        with open(report) as f:
            self.assertEqual([step["iteration"] for step in json.load(f)["iterations"]], [1, 2])
        # A client stream is pushed once: refused at submit, saying what to do instead.
        with self.assertRaises(recal.RecalError) as refused:
            self.client.submit(self.client.upload_model(model), recal_pb2.ClientStreamSource(), batch_size=12,
                               iterations=2)
        self.assertEqual(refused.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("client stream is pushed once", str(refused.exception))

    def test_exported_programs_that_cannot_be_recalibrated_are_refused_at_upload(self):
        no_batchnorm = os.path.join(FIXTURES, "models", "no_batchnorm.exported_eval.pt2")
        with self.assertRaises(recal.RecalError) as caught:
            self.client.upload_model(no_batchnorm)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("no BatchNorm", caught.exception.message)
        # A program that reads a file: refused naming the operator, and the server goes on.
        hostile = os.path.join(self.dir, "from_file.pt2")
        _edit_program(os.path.join(FIXTURES, "models", "twice.exported_eval.pt2"), hostile,
                      lambda node: node["target"].startswith("torch.ops.aten.conv"),
                      "torch.ops.aten.from_file.default")
        with self.assertRaises(recal.RecalError) as caught:
            self.client.upload_model(hostile)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("aten::from_file is not allowed", caught.exception.message)
        self.assertEqual(self.done_job().state, recal.SUCCEEDED)

    def test_data_that_does_not_fit_a_programs_inputs_is_refused_naming_the_input_and_dimension(self):
        # The upload keeps the program's input contract: x [batch, 3, 32, 32] float32.
        model = self.client.upload_model(os.path.join(CONTRACT, "static32.pt2"))
        self.assertEqual((model.inputs[0].name, model.inputs[0].dtype), ("x", "float32"))
        self.assertEqual([d.fixed for d in model.inputs[0].dims[1:]], [3, 32, 32])
        # At submit, before a worker is spent, where the server knows the data's shape.
        int64_file = os.path.join(self.tmp, "root", "contract_int64.npy")
        shutil.copy(os.path.join(CONTRACT, "data", "x32_int64.npy"), int64_file)
        for data, says in (("synthetic:3x16x16", "input 'x' dim 2 is 16, but the program was exported for exactly 32"),
                           ("npy:" + int64_file, "input 'x' is int64, but the program takes float32")):
            with self.assertRaises(recal.RecalError) as caught:
                self.client.submit(model, data, batch_size=4)
            self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT, data)
            self.assertIn(says, caught.exception.message)
            self.assertIsNone(caught.exception.job)
        # A client stream: its first batch fails the job, with the same words.
        with self.assertRaises(recal.RecalError) as caught:
            self.client.recalibrate_stream(model, [np.zeros((4, 3, 16, 16), np.float32)] * 3)
        self.assertEqual(caught.exception.job.state, recal.FAILED)
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("batch 0: input 'x' dim 2 is 16, but the program was exported for exactly 32",
                      caught.exception.message)

    def test_errors(self):
        with self.assertRaises(recal.RecalError) as caught:
            self.client.recalibrate(RESNET, data="npy:/etc/passwd", out=os.path.join(self.dir, "x.pt"))
        self.assertEqual(caught.exception.code, grpc.StatusCode.PERMISSION_DENIED)
        self.assertIn("/etc/passwd", caught.exception.message)
        self.assertTrue(str(caught.exception).startswith("PERMISSION_DENIED: "))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "x.pt")))

        with self.assertRaises(recal.RecalError) as caught:
            self.client.submit(self.model, "npy:data/missing.npy")
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(recal.RecalError) as caught:
            self.client.submit(self.model, "png:x")  # refused here, before any call
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("unknown scheme", caught.exception.message)
        with self.assertRaises(TypeError):
            self.client.submit(self.model, RESNET_DATA, max_batchez=3)
        with self.assertRaises(ValueError):
            self.client.submit(self.model, RESNET_DATA, estimator="median")
        with self.assertRaises(recal.RecalError) as caught:
            self.client.get("no-such-job")
        self.assertIn(caught.exception.code, (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT))
        with self.assertRaises(recal.RecalError) as caught:
            self.client.upload_model(os.path.join(FIXTURES, "data", "resnet18.npy"))
        self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)

        # A job that fails on the server: RecalError with the job's code, message and Job.
        with self.assertRaises(recal.RecalError) as caught:
            self.client.recalibrate(RESNET, data="synthetic:5", batch_size=2, max_batches=1)
        error = caught.exception
        self.assertEqual(error.job.state, recal.FAILED)
        self.assertNotEqual(error.code, grpc.StatusCode.OK)
        self.assertIn(error.job.error.message, error.message)
        self.assertIn("FAILED", str(error))

    # --------------------------------------------------------------------------- specs

    def test_uint8_tensor_files_are_normalised_on_the_server(self):
        # The same images as uint8 (a quarter of the bytes) with ?scale&mean&std, and as the
        # float32 tensors ToTensor + Normalize would give: the same statistics, to the bit.
        rng = np.random.default_rng(5)
        u8 = rng.integers(0, 256, (12, 3, 32, 32), dtype=np.uint8)
        mean = np.array([0.485, 0.456, 0.406], np.float32)[None, :, None, None]
        std = np.array([0.229, 0.224, 0.225], np.float32)[None, :, None, None]
        f32 = (u8.astype(np.float32) / np.float32(255) - mean) / std
        root = os.path.join(self.tmp, "root")
        np.save(os.path.join(root, "u8.npy"), u8)
        np.save(os.path.join(root, "f32.npy"), f32)
        bns = {}
        for name, spec in (("u8", "npy:u8.npy?scale=255&mean=0.485,0.456,0.406&std=0.229,0.224,0.225"),
                           ("f32", "npy:f32.npy")):
            bns[name] = os.path.join(self.dir, name + ".safetensors")
            job = self.client.recalibrate(RESNET, data=spec, out=os.path.join(self.dir, name + ".pt"),
                                          bn_out=bns[name], batch_size=4)
            self.assertEqual(job.state, recal.SUCCEEDED, job.error.message)
        with open(bns["u8"], "rb") as a, open(bns["f32"], "rb") as b:
            self.assertEqual(a.read(), b.read())
        # Without mean/std for every channel the job fails naming the mismatch.
        failed = self.client.wait(self.client.submit(self.model, "npy:u8.npy?mean=0.5&std=0.5", batch_size=4))
        self.assertEqual(failed.state, recal.FAILED)
        self.assertIn("3 channels", failed.error.message)

    def test_image_folder_jobs(self):
        transform = "?resize=36&crop=32&mean=0.485,0.456,0.406&std=0.229,0.224,0.225"
        report = os.path.join(self.dir, "report.json")
        job = self.client.recalibrate(RESNET, data="images:imgs" + transform, out=os.path.join(self.dir, "out.pt"),
                                      report=report, batch_size=3)
        self.assertEqual(job.state, recal.SUCCEEDED)
        self.assertEqual((job.spec.data.image_folder.path, job.spec.data.image_folder.crop), ("imgs", 32))
        self.assertEqual(job.progress.samples_done, image_folders.IMAGES)
        with open(report) as f:
            self.assertEqual(json.load(f)["samples"], image_folders.IMAGES)  # recalibrate(): ints as ints

        with self.assertRaises(recal.RecalError) as caught:
            self.client.submit(self.model, "images:" + os.path.join(self.tmp, "outside", "imgs") + transform)
        self.assertEqual(caught.exception.code, grpc.StatusCode.PERMISSION_DENIED)

        failing = self.client.submit(self.model, "images:with_bad" + transform + "&on_bad=fail", batch_size=3)
        failed = self.client.wait(failing)
        self.assertEqual(failed.state, recal.FAILED)
        self.assertIn("x.jpg", failed.error.message)

        # The same folder as a message, skipping what cannot be read.
        folder = recal_pb2.ImageFolderSource(path="with_bad", resize=36, crop=32, mean=[0.485, 0.456, 0.406],
                                             std=[0.229, 0.224, 0.225], on_bad=recal_pb2.ImageFolderSource.SKIP)
        skipped = self.client.wait(self.client.submit(self.model, folder, batch_size=3))
        self.assertEqual(skipped.state, recal.SUCCEEDED, skipped.error.message)
        self.assertEqual(skipped.progress.samples_done, image_folders.IMAGES)
        skipped_path = os.path.join(self.dir, "skipped.json")
        self.client.download(skipped, skipped_path, artifact="report")
        with open(skipped_path) as f:
            skipped_report = json.load(f)
        self.assertEqual(skipped_report["samples"], image_folders.IMAGES)  # int64 as JSON numbers
        self.assertEqual(skipped_report["skipped_files"], 1)

        # No options: ImageNet's evaluation transform, filled in by the server and spelled out
        # in the report (the job itself keeps what was asked).
        imagenet = self.client.wait(self.client.submit(self.model, "images:imgs", batch_size=3, max_batches=1))
        self.assertEqual(imagenet.state, recal.SUCCEEDED, imagenet.error.message)
        self.assertEqual(imagenet.spec.data.image_folder.resize, 0)
        imagenet_path = os.path.join(self.dir, "imagenet.json")
        self.client.download(imagenet, imagenet_path, artifact="report")
        with open(imagenet_path) as f:
            self.assertRegex(json.load(f)["data"],
                             r"^images:\S*imgs\?resize=256&crop=224&mean=0\.485,0\.456,0\.406&std=0\.229,0\.224,0\.225$")

    # ------------------------------------------------------------------ environment

    def test_server_and_token_come_from_the_environment(self):
        # Auth is on: list_models succeeds only if RECAL_TOKEN was sent, and only at RECAL_SERVER.
        env = {"RECAL_SERVER": self.server.address, "RECAL_TOKEN": self.server.token}
        with mock.patch.dict(os.environ, env), recal.Client(timeout=30) as client:
            self.assertEqual(client.target, self.server.address)
            self.assertIn(self.model.id, [m.id for m in client.list_models()])
        with mock.patch.dict(os.environ, env), recal.Client(token="", timeout=30) as anonymous:
            with self.assertRaises(recal.RecalError) as refused:  # token="": none, not the env's
                anonymous.list_models()
            self.assertEqual(refused.exception.code, grpc.StatusCode.UNAUTHENTICATED)
        without = {k: v for k, v in os.environ.items() if k not in env}
        with mock.patch.dict(os.environ, without, clear=True), recal.Client() as default:
            self.assertEqual(default.target, "localhost:50051")

    # -------------------------------------------------------------------------- README

    def test_readme_examples_run(self):
        """The client's ```python blocks of client/python/README.md (the first two; the
        third, recal.torch's, runs in test_torch_sdk), as written, against this server (the
        only change: localhost:50051 becomes its address)."""
        with open(os.path.join(ROOT, "client", "python", "README.md")) as f:
            readme = f.read()
        blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
        self.assertEqual(len(blocks), 3)
        with open(os.path.join(ROOT, "README.md")) as f:
            top = re.findall(r"```python\n(.*?)```", f.read(), re.S)
        self.assertEqual(top, [blocks[2], blocks[0]],
                         "README.md's Python examples are client/python/README.md's third and first")
        os.symlink(RESNET, os.path.join(self.dir, "resnet18.pt"))
        outputs = []
        for block in blocks[:2]:
            self.assertIn('"localhost:50051"', block)
            result = subprocess.run([sys.executable, "-c", block.replace("localhost:50051", self.server.address)],
                                    cwd=self.dir, capture_output=True, text=True, timeout=120,
                                    env=dict(os.environ, RECAL_TOKEN=self.server.token))
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            outputs.append(result.stdout)
        self.assertIn("batch 3/3", outputs[0])
        self.assertIn("SUCCEEDED 20 samples", outputs[0])
        self.assertIn("StatusCode.PERMISSION_DENIED", outputs[1])
        for name in ("resnet18.recalibrated.pt", "resnet18.bn.safetensors", "report.json"):
            self.assertTrue(os.path.exists(os.path.join(self.dir, name)), name)


class RestartTest(unittest.TestCase):
    """A server of its own, killed with SIGKILL in the middle of a job."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="recal-pyclient-restart-")
        self.server = Server(os.path.join(self.tmp, "data"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.addCleanup(self.server.stop)

    def test_watch_continues_across_a_server_restart(self):
        client = recal.Client(self.server.address, token=self.server.token, reconnect_seconds=60)
        self.addCleanup(client.close)
        model = client.upload_model(RESNET)
        job = client.submit(model, "synthetic:3x64x64", batch_size=8, max_batches=60)
        events = []
        restarter = None
        for event in client.watch(job.id):
            events.append(event)
            if restarter is None and event.WhichOneof("kind") == "progress":
                self.server.kill()  # mid-job; back on the same port a little later
                restarter = threading.Timer(0.5, self.server.start)
                restarter.start()
        restarter.join()
        self.assertEqual(self.server.starts, 2)
        _assert_consecutive(self, events)
        self.assertEqual(_states(events), ["QUEUED", "RUNNING", "QUEUED", "RUNNING", "SUCCEEDED"])
        final = client.get(job.id)
        self.assertEqual(final.state, recal.SUCCEEDED)
        self.assertEqual(final.attempts, 2)
        self.assertEqual(final.progress.batches_done, 60)


class MessagesTest(unittest.TestCase):
    """recal.to_dict / recal.to_json: ints as ints (protobuf's JSON writes int64 as strings),
    enums by name, defaults included, unset sub-messages left out."""

    def test_a_report_has_ints_as_ints_and_enums_by_name(self):
        layer = report_pb2.LayerReport(name="bn1", channels=64, samples=1 << 40,
                                       mean_shift_in_std=report_pb2.ChannelSpread(min=0.1, max=float("inf")))
        report = report_pb2.RunReport(model="m.pt", estimator=report_pb2.BATCH_AVERAGE, batch_size=8, batches=3,
                                      samples=24, seconds=0.5, unused_layers=["fc.bn"], layers=[layer])
        # The control: protobuf's own dict has strings for these.
        self.assertEqual(json_format.MessageToDict(report, preserving_proto_field_name=True)["batches"], "3")
        as_dict = recal.to_dict(report)
        self.assertEqual((as_dict["batches"], as_dict["samples"], as_dict["batch_size"]), (3, 24, 8))
        self.assertEqual((as_dict["estimator"], as_dict["modules"]), ("BATCH_AVERAGE", "MODULE_MODE_UNSPECIFIED"))
        self.assertEqual((as_dict["stopped_early"], as_dict["skipped_files"], as_dict["device"]), (False, 0, ""))
        self.assertEqual(as_dict["unused_layers"], ["fc.bn"])
        first = as_dict["layers"][0]
        self.assertIs(type(first["samples"]), int)
        self.assertEqual(first["samples"], 1 << 40)
        self.assertEqual(first["mean_shift_in_std"], {"min": 0.1, "median": 0.0, "max": float("inf")})
        self.assertNotIn("var_ratio", first)  # never set
        text = recal.to_json(report)
        loaded = json.loads(text)
        self.assertEqual(loaded["layers"][0]["mean_shift_in_std"]["max"], "Infinity")  # standard JSON
        self.assertEqual(loaded["batches"], 3)
        self.assertEqual(recal.messages.parse_report(text), report)  # and it reads back

    def test_a_job_with_timestamps_a_oneof_labels_and_float32_values(self):
        source = recal_pb2.DataSource(client_stream=recal_pb2.ClientStreamSource(mean=[0.485], std=[0.229], scale=255))
        job = recal_pb2.Job(id="j1", state=recal.SUCCEEDED,
                            spec=recal_pb2.JobSpec(model_id="sha256:ab", data=source, batch_size=8, labels={"a": "b"}))
        job.create_time.FromSeconds(86400)
        as_dict = recal.to_dict(job)
        self.assertEqual(as_dict["state"], "SUCCEEDED")
        self.assertEqual(as_dict["create_time"], "1970-01-02T00:00:00Z")
        self.assertNotIn("start_time", as_dict)
        self.assertEqual(as_dict["spec"]["labels"], {"a": "b"})
        self.assertEqual(as_dict["spec"]["batch_size"], 8)
        self.assertEqual(list(as_dict["spec"]["data"]), ["client_stream"])  # the oneof member that is set
        self.assertEqual(as_dict["spec"]["data"]["client_stream"], {"mean": [0.485], "std": [0.229], "scale": 255.0})


def _safetensors_file(path, header, data=b"", header_bytes=None):
    """A safetensors file written by hand, header and all, as an attacker would."""
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text) if header_bytes is None else header_bytes) + text + data)
    return path


class SafetensorsReaderTest(unittest.TestCase):
    """recal.read_safetensors (pure Python) against files the `safetensors` package and torch
    write, and against hostile files, which it refuses with RecalError(DATA_LOSS)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="recal-safetensors-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_reads_what_the_safetensors_package_writes_as_numpy_or_raw(self):
        from safetensors.numpy import save_file

        rng = np.random.default_rng(0)
        arrays = {"bn.running_mean": rng.standard_normal(7).astype(np.float32),
                  "bn.running_var": rng.standard_normal((2, 3)).astype(np.float64),
                  "steps": np.array(5, dtype=np.int64), "mask": np.array([True, False]),
                  "pixels": np.arange(6, dtype=np.uint8).reshape(3, 2, 1), "half": np.ones(3, np.float16),
                  "big": np.array([2 ** 40], dtype=np.uint64), "empty": np.zeros((0, 4), np.float32)}
        path = os.path.join(self.dir, "np.safetensors")
        save_file(arrays, path, metadata={"format": "np"})
        as_numpy = recal.read_safetensors(path, to="numpy")
        self.assertEqual(sorted(as_numpy), sorted(arrays))
        for name, expected in arrays.items():
            self.assertEqual(as_numpy[name].dtype, expected.dtype, name)
            np.testing.assert_array_equal(as_numpy[name], expected, err_msg=name)
        raw = recal.read_safetensors(path, to="raw")
        self.assertEqual(raw["bn.running_var"], ("F64", (2, 3), arrays["bn.running_var"].tobytes()))
        self.assertEqual(raw["steps"].shape, ())

    def test_reads_what_torch_writes_torch_tensors_by_default(self):
        import torch
        from safetensors.torch import save_file

        tensors = {"a.running_mean": torch.randn(5), "b": torch.randn(2, 3, dtype=torch.float64),
                   "c": torch.randn(4).to(torch.bfloat16), "d": torch.arange(3, dtype=torch.int32)}
        path = os.path.join(self.dir, "torch.safetensors")
        save_file(tensors, path)
        loaded = recal.read_safetensors(path)  # torch is importable here: torch tensors
        for name, expected in tensors.items():
            self.assertIsInstance(loaded[name], torch.Tensor)
            self.assertEqual(loaded[name].dtype, expected.dtype, name)
            self.assertTrue(torch.equal(loaded[name], expected), name)
        as_numpy = recal.read_safetensors(path, to="numpy")  # bfloat16 becomes float32, exactly
        np.testing.assert_array_equal(as_numpy["c"], tensors["c"].float().numpy())

    def test_refuses_hostile_files(self):
        eight = struct.pack("<2f", 1.0, 2.0)
        ok = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
        cases = {
            "a header length past the end": (ok, eight, 1 << 20, "header of 1048576 bytes"),
            "a huge header length": (ok, eight, (1 << 64) - 1, "the limit is"),
            "offsets past the end": ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, eight, None,
                                     "cover 16 bytes"),
            "overlapping tensors": ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                     "y": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, eight, None,
                                    "a gap or an overlap"),
            "a gap": ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, eight, None, "a gap or an overlap"),
            "bytes left over": ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, eight, None,
                                "the file holds 8"),
            "a shape that is not the size": ({"x": {"dtype": "F32", "shape": [1 << 62, 4], "data_offsets": [0, 8]}},
                                             eight, None, "spans 8 bytes"),
            "a negative dimension": ({"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, eight, None,
                                     "has shape"),
            "an unknown dtype": ({"x": {"dtype": "F128", "shape": [1], "data_offsets": [0, 8]}}, eight, None,
                                 "dtype 'F128'"),
            "reversed offsets": ({"x": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}}, eight, None,
                                 "data_offsets"),
            "a header that is not an object": ([1, 2], b"", None, "not a JSON object"),
        }
        for what, (header, data, header_bytes, expected) in cases.items():
            path = _safetensors_file(os.path.join(self.dir, "bad.safetensors"), header, data, header_bytes)
            with self.subTest(what), self.assertRaises(recal.RecalError) as caught:
                recal.read_safetensors(path, to="raw")
            self.assertEqual(caught.exception.code, grpc.StatusCode.DATA_LOSS, what)
            self.assertIn(expected, caught.exception.message, what)
        path = os.path.join(self.dir, "dup.safetensors")
        text = b'{"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}'
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + b"\x01")
        with self.assertRaises(recal.RecalError) as caught:
            recal.read_safetensors(path, to="raw")
        self.assertIn("appears twice", caught.exception.message)
        with open(path, "wb") as f:
            f.write(b"\x01\x02")
        with self.assertRaises(recal.RecalError) as caught:
            recal.read_safetensors(path)
        self.assertIn("shorter than the 8-byte header length", caught.exception.message)


def _unused_port():
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class UnreachableServerTest(unittest.TestCase):
    """No server at the address: the first call fails in seconds and says what to do,
    instead of retrying in silence for retry_seconds (30 s)."""

    def test_no_server_fails_fast_naming_the_address_and_the_fix(self):
        address = "127.0.0.1:%d" % _unused_port()
        started = time.monotonic()
        with recal.Client(address, token="") as client, self.assertRaises(recal.RecalError) as caught:
            client.list_models()
        elapsed = time.monotonic() - started
        self.assertLess(elapsed, 10)
        self.assertGreaterEqual(elapsed, 4)  # it did wait for the default connect_seconds (5)
        self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
        message = caught.exception.message
        self.assertIn(address, message)
        self.assertIn("Is recal-server running there?", message)
        self.assertIn("recal-server --listen=" + address, message)
        self.assertIn("RECAL_SERVER", message)

    def test_the_connect_deadline_is_a_parameter_and_covers_every_call(self):
        address = "127.0.0.1:%d" % _unused_port()
        tmp = tempfile.mkdtemp(prefix="recal-pyclient-unreachable-")
        self.addCleanup(shutil.rmtree, tmp, True)
        with recal.Client(address, token="", connect_seconds=0.5) as client:
            for call in (client.list, lambda: client.get("job"), lambda: list(client.watch("job")),
                         lambda: client.download("job", os.path.join(tmp, "out.pt"))):
                started = time.monotonic()
                with self.assertRaises(recal.RecalError) as caught:
                    call()
                self.assertLess(time.monotonic() - started, 3)
                self.assertEqual(caught.exception.code, grpc.StatusCode.UNAVAILABLE)
                self.assertIn("within 0.5 s", caught.exception.message)


class MutualTlsTest(unittest.TestCase):
    """The client against the real server over mutual TLS, certificates made at test time."""

    def test_recalibrates_over_mutual_tls_and_needs_its_certificate(self):
        tmp = tempfile.mkdtemp(prefix="recal-pyclient-tls-")
        self.addCleanup(shutil.rmtree, tmp, True)
        certs = os.path.join(tmp, "certs")
        subprocess.run(["bash", os.path.join(ROOT, "tests", "certs", "make_test_certs.sh"), certs], check=True)
        server = Server(os.path.join(tmp, "data"), flags=(
            "--tls_cert=" + os.path.join(certs, "server.pem"), "--tls_key=" + os.path.join(certs, "server.key"),
            "--tls_client_ca=" + os.path.join(certs, "ca.pem")))
        self.addCleanup(server.stop)
        with recal.Client(server.address, token=server.token, timeout=30,
                          tls_ca=os.path.join(certs, "ca.pem"), tls_cert=os.path.join(certs, "client.pem"),
                          tls_key=os.path.join(certs, "client.key")) as client:
            out = os.path.join(tmp, "out.pt")
            job = client.recalibrate(RESNET, data=RESNET_DATA, out=out, batch_size=8,
                                     bn_out=os.path.join(tmp, "bn.safetensors"))
            self.assertEqual(job.state, recal.SUCCEEDED, job.error.message)
            bn = safetensors_io.load(os.path.join(tmp, "bn.safetensors"), as_numpy=True)
            self.assertLessEqual(_worst_reference_error(bn), 1e-5)
        with recal.Client(server.address, token=server.token, timeout=5, retry_seconds=0, connect_seconds=1,
                          tls_ca=os.path.join(certs, "ca.pem")) as anonymous:
            with self.assertRaises(recal.RecalError) as refused:
                list(anonymous.list())
            self.assertEqual(refused.exception.code, grpc.StatusCode.UNAVAILABLE)


if __name__ == "__main__":
    unittest.main(verbosity=2)
