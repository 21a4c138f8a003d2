"""Issue 49 items 1 and 2 against the real recal-server, through the Python client.

A tenant's max_stored_bytes holds while many clients upload at once (each model is
inspected by a real sandboxed recal-worker, so the window between an upload's commit and
its model row is real); a small data dir (a tmpfs, mounted as root; skipped, saying why,
where mount is not permitted) never fills: a large upload is refused below
--min_free_disk_bytes, the health service's "recal.uploads" follows the floor, and with no
floor an upload that finds the disk full is removed and says so while the server serves on.

Run by ctest (tests/python_client/CMakeLists.txt) as
    PYTHONPATH=client/python .venv/bin/python -m unittest -v test_quota
with RECAL_SERVER_BIN and RECAL_FIXTURES_DIR set; by hand they default to build/.
"""

import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

import grpc

import recal
from test_client import Server

MiB = 1 << 20


def tiny_models(directory, count):
    """`count` TorchScript models of one architecture, each with weights of its own (so bytes
    and digest of its own); their sizes differ by a few per cent."""
    import torch
    paths = []
    for seed in range(count):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).eval()
        path = os.path.join(directory, "tiny%d.pt" % seed)
        torch.jit.trace(model, torch.randn(1, 3, 8, 8)).save(path)
        paths.append(path)
    return paths


def upload_all_at_once(server, paths):
    """Every path uploaded from a thread of its own, all started together; the accepted
    models and the RecalErrors."""
    accepted, refused, lock = [], [], threading.Lock()
    start = threading.Barrier(len(paths))

    def upload(path):
        with recal.Client(server.address, token=server.token) as client:
            start.wait()
            try:
                model = client.upload_model(path)
                with lock:
                    accepted.append(model)
            except recal.RecalError as error:
                with lock:
                    refused.append(error)

    threads = [threading.Thread(target=upload, args=(path,)) for path in paths]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return accepted, refused


class QuotaUnderConcurrencyTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="recal-quota-")
        self.paths = tiny_models(self.dir, 24)
        sizes = [os.path.getsize(path) for path in self.paths]
        self.assertLess(max(sizes), min(sizes) * 8 // 7, "sizes too far apart for the quota below")
        self.quota = max(sizes) * 7 // 2  # room for 3 of them, not 4
        self.server = Server(os.path.join(self.dir, "data"),
                             auth_lines=["tenant default max_stored_bytes=%d" % self.quota])

    def tearDown(self):
        self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_24_concurrent_uploads_never_store_more_than_the_quota(self):
        accepted, refused = upload_all_at_once(self.server, self.paths)
        self.assertEqual(len(accepted) + len(refused), 24)
        self.assertEqual(len(accepted), 3, "the quota has room for 3 and nothing else holds any")
        for error in refused:
            self.assertEqual(error.code, grpc.StatusCode.RESOURCE_EXHAUSTED, error.message)
            self.assertIn("max_stored_bytes=%d" % self.quota, error.message)
        with recal.Client(self.server.address, token=self.server.token) as client:
            usage = client.usage()
            self.assertEqual(usage.model_bytes, sum(model.size for model in accepted))
            self.assertLessEqual(usage.stored_bytes, self.quota)
            self.assertEqual(usage.reserved_bytes, 0)
            self.assertEqual(len(client.list_models()), 3)


def mount_tmpfs(directory, size):
    """A tmpfs of `size` bytes at `directory`; the reason when it cannot be mounted."""
    os.makedirs(directory, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % size, "tmpfs", directory],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        return "cannot mount a tmpfs (%s): run as root to try a small disk" % mounted.stderr.strip()
    return None


def garbage(path, size):
    """`size` bytes the client sends (a zip's magic, no directory: the server judges it)."""
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04" + os.urandom(size - 4))
    return path


class SmallDiskTest(unittest.TestCase):
    """recal-server whose data dir is an 8 MiB tmpfs."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="recal-disk-")
        self.data = os.path.join(self.dir, "data")
        why_not = mount_tmpfs(self.data, 8 * MiB)
        if why_not:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.skipTest(why_not)
        self.server = None

    def tearDown(self):
        if self.server:
            self.server.stop()
        subprocess.run(["umount", "-l", self.data], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, min_free):
        self.server = Server(self.data, flags=["--min_free_disk_bytes=%d" % min_free])
        return recal.Client(self.server.address, token=self.server.token)

    def wait_for_health(self, client, service, status):
        deadline = time.monotonic() + 15
        while client.health(service) != status and time.monotonic() < deadline:
            time.sleep(0.2)
        return client.health(service)

    def test_below_the_floor_uploads_are_refused_and_health_says_so(self):
        with self.start(min_free=4 * MiB) as client:
            with self.assertRaises(recal.RecalError) as caught:
                client.upload_model(garbage(os.path.join(self.dir, "big.pt"), 6 * MiB))
            self.assertEqual(caught.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("--min_free_disk_bytes", caught.exception.message)
            self.assertIn("bytes free", caught.exception.message)
            self.assertEqual(client.usage().stored_bytes, 0)
            self.assertEqual(client.health("recal.uploads"), "SERVING")
            # Something else fills the disk past the floor: uploads say NOT_SERVING, the rest serves.
            filler = garbage(os.path.join(self.data, "filler"), 5 * MiB)
            self.assertEqual(self.wait_for_health(client, "recal.uploads", "NOT_SERVING"), "NOT_SERVING")
            self.assertEqual(client.health(""), "SERVING")
            os.remove(filler)
            self.assertEqual(self.wait_for_health(client, "recal.uploads", "SERVING"), "SERVING")

    def test_with_no_floor_an_upload_that_fills_the_disk_is_removed_and_the_server_serves_on(self):
        with self.start(min_free=0) as client:
            with self.assertRaises(recal.RecalError) as caught:
                client.upload_model(garbage(os.path.join(self.dir, "huge.pt"), 12 * MiB))
            self.assertEqual(caught.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertIn("disk is full", caught.exception.message)
            self.assertIn("were removed", caught.exception.message)
            usage = client.usage()
            self.assertEqual(usage.upload_bytes, 0)
            self.assertEqual(usage.reserved_bytes, 0)
            self.assertGreater(shutil.disk_usage(self.data).free, 6 * MiB, "the partial upload is gone")
            self.assertEqual(client.health(""), "SERVING")
            self.assertEqual(client.list_models(), [])


if __name__ == "__main__":
    unittest.main()
