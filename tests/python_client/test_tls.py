"""TLS and mutual TLS from the clients: the Python package and recalctl (hence the C++
library) against a small Python gRPC server that serves the Recal service over TLS, asks
for a client certificate (require_client_auth) and records what each call carried. It
stands in for recal-server, whose own TLS is tested in tests/server/; the certificates
come from tests/certs/make_test_certs.sh.

Run by ctest (tests/python_client/CMakeLists.txt) as
    PYTHONPATH=client/python .venv/bin/python -m unittest -v test_tls
with RECALCTL_BIN and RECAL_MAKE_TEST_CERTS set; by hand they default to build/ and tests/.
"""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import unittest
from concurrent import futures

import grpc

import recal
from recal import recal_pb2, recal_pb2_grpc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECALCTL = os.environ.get("RECALCTL_BIN", os.path.join(ROOT, "build", "bin", "recalctl"))
MAKE_CERTS = os.environ.get("RECAL_MAKE_TEST_CERTS",
                            os.path.join(ROOT, "tests", "certs", "make_test_certs.sh"))
TOKEN = "recal_" + "ab" * 32
EXIT_UNREACHABLE = 3  # recalctl's exit code for UNAVAILABLE


class RecordingRecal(recal_pb2_grpc.RecalServicer):
    """ListJobs answers an empty page and records the call's metadata and the client
    certificate's common name (empty when the call had none)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []

    def ListJobs(self, request, context):
        names = context.auth_context().get("x509_common_name", [b""])
        with self.lock:
            self.calls.append((dict(context.invocation_metadata()), names[0].decode()))
        return recal_pb2.ListJobsResponse()


class TlsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="recal-tls-")
        cls.certs = os.path.join(cls.tmp, "certs")
        subprocess.run([MAKE_CERTS, cls.certs], check=True)
        credentials = grpc.ssl_server_credentials(
            [(cls.read("server.key"), cls.read("server.pem"))],
            root_certificates=cls.read("ca.pem"), require_client_auth=True)
        cls.servicer = RecordingRecal()
        cls.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        recal_pb2_grpc.add_RecalServicer_to_server(cls.servicer, cls.server)
        cls.port = cls.server.add_secure_port("127.0.0.1:0", credentials)
        cls.server.start()
        cls.address = "127.0.0.1:%d" % cls.port

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(None)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def read(cls, name):
        with open(cls.cert(name), "rb") as f:
            return f.read()

    @classmethod
    def cert(cls, name):
        return os.path.join(cls.certs, name)

    def setUp(self):
        with self.servicer.lock:
            self.servicer.calls.clear()

    def calls(self):
        with self.servicer.lock:
            return list(self.servicer.calls)

    def identity(self, name="client"):
        """tls_ca, tls_cert, tls_key for the Python client."""
        return dict(tls_ca=self.cert("ca.pem"), tls_cert=self.cert(name + ".pem"),
                    tls_key=self.cert(name + ".key"))

    def client(self, target=None, **kwargs):
        # A refused handshake never makes the channel ready: 1 s of connect deadline, not 5.
        client = recal.Client(target or self.address, timeout=10, retry_seconds=0.3, connect_seconds=1,
                              **kwargs)
        self.addCleanup(client.close)
        return client

    def assert_refused(self, client):
        before = len(self.calls())
        with self.assertRaises(recal.RecalError) as raised:
            client.list()
        self.assertEqual(raised.exception.code, grpc.StatusCode.UNAVAILABLE, raised.exception.message)
        self.assertEqual(len(self.calls()), before, "the refused call never reached the service")

    def recalctl(self, *args, env=None):
        full_env = {k: v for k, v in os.environ.items()
                    if k not in ("RECAL_SERVER", "RECAL_TOKEN", "RECAL_TLS_CA", "RECAL_TLS_CERT",
                                 "RECAL_TLS_KEY")}
        full_env.update(env or {})
        return subprocess.run([RECALCTL, *args], capture_output=True, text=True, env=full_env,
                              timeout=60)

    # -------------------------------------------------------------------- the certificates

    def test_the_certificates_are_what_the_script_promises(self):
        def verify(ca, name):
            return subprocess.run(["openssl", "verify", "-CAfile", self.cert(ca), self.cert(name)],
                                  capture_output=True, text=True)

        for name in ("server.pem", "client.pem"):
            self.assertEqual(verify("ca.pem", name).returncode, 0, name)
        expired = verify("ca.pem", "expired.pem")
        self.assertIn("certificate has expired", expired.stdout + expired.stderr)
        self.assertNotEqual(verify("ca.pem", "stranger.pem").returncode, 0)
        self.assertEqual(verify("other_ca.pem", "stranger.pem").returncode, 0)
        text = subprocess.run(["openssl", "x509", "-in", self.cert("server.pem"), "-noout", "-text"],
                              capture_output=True, text=True, check=True).stdout
        self.assertIn("DNS:localhost", text)
        self.assertIn("IP Address:127.0.0.1", text)
        text = subprocess.run(["openssl", "x509", "-in", self.cert("client.pem"), "-noout", "-text"],
                              capture_output=True, text=True, check=True).stdout
        self.assertIn("CN = trainer-a", text)
        self.assertIn("DNS:trainer-a.example", text)
        self.assertIn("TLS Web Client Authentication", text)
        self.assertEqual(os.stat(self.cert("client.key")).st_mode & 0o077, 0, "keys are private")
        # Idempotent: a second run into the same directory succeeds and leaves a valid set.
        subprocess.run([MAKE_CERTS, self.certs], check=True)
        self.assertEqual(verify("ca.pem", "client.pem").returncode, 0)

    # ------------------------------------------------------------------- the Python client

    def test_python_client_with_a_client_certificate_and_a_token(self):
        self.assertEqual(self.client(token=TOKEN, **self.identity()).list(), [])
        (metadata, common_name), = self.calls()
        self.assertEqual(metadata.get("authorization"), "Bearer " + TOKEN)
        self.assertEqual(common_name, "trainer-a")

    def test_python_client_without_a_client_certificate_is_refused(self):
        self.assert_refused(self.client(tls_ca=self.cert("ca.pem")))

    def test_python_client_with_a_certificate_of_another_ca_is_refused(self):
        self.assert_refused(self.client(**self.identity("stranger")))

    def test_python_client_with_an_expired_certificate_is_refused(self):
        self.assert_refused(self.client(**self.identity("expired")))

    def test_python_client_refuses_a_server_its_roots_do_not_vouch_for(self):
        self.assert_refused(self.client(tls_ca=self.cert("other_ca.pem"), tls_cert=self.cert("client.pem"),
                                        tls_key=self.cert("client.key")))

    def test_a_plaintext_python_client_is_refused(self):
        self.assert_refused(self.client())

    def test_python_client_server_name_override(self):
        # The address is an IP; the name checked against the certificate is the override.
        self.assertEqual(self.client(tls_server_name="localhost", **self.identity()).list(), [])
        self.assert_refused(self.client(tls_server_name="wrong.example", **self.identity()))

    def test_python_client_rejects_half_an_identity_and_bad_files(self):
        with self.assertRaisesRegex(ValueError, "tls_cert needs tls_key"):
            recal.Client(self.address, tls_cert=self.cert("client.pem"))
        with self.assertRaisesRegex(ValueError, "tls_key needs tls_cert"):
            recal.Client(self.address, tls_key=self.cert("client.key"))
        missing = os.path.join(self.tmp, "missing.pem")
        with self.assertRaises(FileNotFoundError) as raised:
            recal.Client(self.address, tls_ca=missing)
        self.assertEqual(raised.exception.filename, missing)
        not_pem = os.path.join(self.tmp, "not.pem")
        with open(not_pem, "w") as f:
            f.write("hello\n")
        with self.assertRaisesRegex(ValueError, "not.pem"):
            recal.Client(self.address, tls_cert=not_pem, tls_key=self.cert("client.key"))
        with self.assertRaisesRegex(ValueError, "not both"):
            recal.Client(self.address, channel=grpc.insecure_channel(self.address), tls=True)

    # --------------------------------------------------------------------------- recalctl

    def recalctl_list(self, *flags, env=None):
        return self.recalctl("list", "--output=json", "--server=" + self.address, "--deadline=5",
                             *flags, env=env)

    def tls_flags(self, name="client"):
        return ("--tls_ca", self.cert("ca.pem"), "--tls_cert", self.cert(name + ".pem"),
                "--tls_key", self.cert(name + ".key"))

    def test_recalctl_with_a_client_certificate_and_a_token(self):
        result = self.recalctl_list(*self.tls_flags(), "--token", TOKEN)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(json.loads(result.stdout), {})
        (metadata, common_name), = self.calls()
        self.assertEqual(metadata.get("authorization"), "Bearer " + TOKEN)
        self.assertEqual(common_name, "trainer-a")

    def test_recalctl_takes_the_identity_from_the_environment(self):
        result = self.recalctl_list(env={"RECAL_TLS_CA": self.cert("ca.pem"),
                                         "RECAL_TLS_CERT": self.cert("client.pem"),
                                         "RECAL_TLS_KEY": self.cert("client.key"),
                                         "RECAL_TOKEN": TOKEN})
        self.assertEqual(result.returncode, 0, result.stderr)
        (metadata, _), = self.calls()
        self.assertEqual(metadata.get("authorization"), "Bearer " + TOKEN)

    def test_recalctl_without_the_right_client_certificate_is_refused(self):
        for flags in (("--tls_ca", self.cert("ca.pem")), self.tls_flags("stranger")):
            result = self.recalctl_list(*flags)
            self.assertEqual(result.returncode, EXIT_UNREACHABLE, (flags, result.stderr))
            self.assertEqual(result.stdout, "")
        self.assertEqual(self.calls(), [])

    def test_recalctl_server_name_override(self):
        result = self.recalctl_list(*self.tls_flags(), "--tls_server_name", "localhost")
        self.assertEqual(result.returncode, 0, result.stderr)
        result = self.recalctl_list(*self.tls_flags(), "--tls_server_name", "wrong.example")
        self.assertEqual(result.returncode, EXIT_UNREACHABLE, result.stderr)
        self.assertEqual(len(self.calls()), 1)

    def test_recalctl_names_what_is_missing_or_unreadable(self):
        result = self.recalctl_list("--tls_ca", self.cert("ca.pem"), "--tls_cert", self.cert("client.pem"))
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("--tls_cert needs --tls_key", result.stderr)
        missing = os.path.join(self.tmp, "missing.key")
        result = self.recalctl_list("--tls_ca", self.cert("ca.pem"), "--tls_cert", self.cert("client.pem"),
                                    "--tls_key", missing)
        self.assertEqual(result.returncode, 4, result.stderr)  # not found
        self.assertIn(missing, result.stderr)
        self.assertEqual(self.calls(), [])


if __name__ == "__main__":
    unittest.main()
