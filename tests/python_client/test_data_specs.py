"""recal.data_source (client/python/recal/specs.py) against every case of
tests/data/data_spec_cases.json, the table of the data-spec grammar that the C++ parser is
tested against too (tests/data/data_spec_cases_test.cc). No server.

Run by ctest (tests/python_client/CMakeLists.txt) as
    PYTHONPATH=client/python .venv/bin/python -m unittest -v test_data_specs
"""

import json
import os
import struct
import unittest

import grpc

import recal
from recal import recal_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = os.environ.get("RECAL_DATA_SPEC_CASES", os.path.join(ROOT, "tests", "data", "data_spec_cases.json"))

CASE_FIELDS = {"spec", "means", "filled", "refused", "note"}
MEANS_FIELDS = {"scheme", "path", "keys", "shape", "seed", "resize", "crop", "mean", "std", "scale",
                "samples", "shuffle", "on_bad"}
# What a field the table leaves out stands for (samples: all, which the message says with 0).
DEFAULTS = {"keys": [], "shape": [], "seed": 0, "resize": 0, "crop": 0, "mean": [], "std": [],
            "scale": 0.0, "samples": 0, "shuffle": False, "on_bad": "fail"}
# ImageNet's, which the Python client leaves unset for the server to fill.
FILLABLE = {"resize", "crop", "mean", "std"}
FORMATS = {recal_pb2.TensorFileSource.NPY: "npy", recal_pb2.TensorFileSource.SAFETENSORS: "safetensors",
           recal_pb2.TensorFileSource.TORCH: "torch"}
ON_BAD = {recal_pb2.ImageFolderSource.FAIL: "fail", recal_pb2.ImageFolderSource.SKIP: "skip"}


def load_cases():
    with open(CASES, encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    specs = set()
    for case in cases:
        unknown = set(case) - CASE_FIELDS
        assert not unknown, "unknown fields %s in %r" % (unknown, case)
        assert ("means" in case) != ("refused" in case), "means or refused: %r" % case
        assert case["spec"] not in specs, "twice in the table: %r" % case["spec"]
        specs.add(case["spec"])
        unknown = set(case.get("means", {})) - MEANS_FIELDS
        assert not unknown, "unknown fields %s in the means of %r" % (unknown, case["spec"])
        filled = set(case.get("filled", []))
        assert filled <= FILLABLE and (not filled or case["means"]["scheme"] == "images"), case["spec"]
    return cases


def integer(value):
    """An integer as the table writes it: a JSON number below 2^53 (what a double holds), or
    decimal digits in a string."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    assert isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 53, value
    return value


def float32(value):
    """`value` as a float field of a message holds it."""
    return struct.unpack("f", struct.pack("f", value))[0]


def without_defaults(fields):
    return {name: value for name, value in fields.items() if value != DEFAULTS.get(name)}


def expected_message_fields(case):
    """What a case means, as the fields of the message the Python client sends: numbers as
    float32, seeds bit for bit, and ImageNet's filled fields left unset."""
    out = {}
    for name, value in case["means"].items():
        if name in case.get("filled", []):
            continue
        if name in ("shape",):
            value = [integer(v) for v in value]
        elif name in ("seed", "resize", "crop", "samples"):
            value = integer(value)
        elif name in ("mean", "std"):
            value = [float32(v) for v in value]
        elif name == "scale":
            value = float32(value)
        out[name] = value
    return without_defaults(out)


def message_fields(source):
    """A DataSource message as the table's fields."""
    kind = source.WhichOneof("source")
    if kind == "tensor_file":
        file = source.tensor_file
        out = {"scheme": FORMATS.get(file.format, "format %d" % file.format), "path": file.path,
               "keys": list(file.keys), "mean": list(file.mean), "std": list(file.std), "scale": file.scale}
    elif kind == "synthetic":
        # int64 in the API: a seed of 2^63 or more travels as the negative number of its bits.
        out = {"scheme": "synthetic", "shape": list(source.synthetic.sample_shape),
               "seed": source.synthetic.seed % (1 << 64)}
    elif kind == "image_folder":
        folder = source.image_folder
        out = {"scheme": "images", "path": folder.path, "resize": folder.resize, "crop": folder.crop,
               "mean": list(folder.mean), "std": list(folder.std), "samples": folder.samples,
               "shuffle": folder.shuffle, "seed": folder.seed,
               "on_bad": ON_BAD.get(folder.on_bad, "on_bad %d" % folder.on_bad)}
    else:
        out = {"scheme": "source %s" % kind}
    return without_defaults(out)


class DataSpecCases(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.cases = load_cases()

    def test_data_source_means_what_the_table_says(self):
        accepted = [case for case in self.cases if "means" in case]
        self.assertGreaterEqual(len(accepted), 50)
        for case in accepted:
            with self.subTest(spec=case["spec"]):
                self.assertEqual(message_fields(recal.data_source(case["spec"])), expected_message_fields(case))

    def test_data_source_refuses_what_the_table_refuses_saying_why(self):
        refused = [case for case in self.cases if "refused" in case]
        self.assertGreaterEqual(len(refused), 50)
        for case in refused:
            spec = case["spec"]
            with self.subTest(spec=spec):
                with self.assertRaises(recal.RecalError) as caught:
                    recal.data_source(spec)
                self.assertEqual(caught.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
                self.assertTrue(caught.exception.message.startswith("bad data spec %r: " % spec),
                                caught.exception.message)
                self.assertIn(case["refused"], caught.exception.message)


class DataSourceBeyondTheTable(unittest.TestCase):

    def test_messages_are_taken_as_they_are(self):
        made = recal_pb2.ImageFolderSource(path="x", resize=2, crop=1, mean=[0, 0, 0], std=[1, 1, 1])
        self.assertEqual(recal.data_source(made).image_folder, made)
        synthetic = recal_pb2.SyntheticSource(sample_shape=[3], seed=-1)
        self.assertEqual(recal.data_source(recal_pb2.DataSource(synthetic=synthetic)).synthetic, synthetic)
        with self.assertRaises(TypeError):
            recal.data_source(3)

    def test_integers_of_thousands_of_digits_are_read_as_the_cpp_parser_reads_them(self):
        # Python's int() refuses strings of over 4300 digits (ValueError, not a refused spec);
        # the C++ parser reads past leading zeros and refuses the rest as too large.
        self.assertEqual(recal.data_source("synthetic:3,seed=" + "0" * 5000 + "7").synthetic.seed, 7)
        self.assertEqual(recal.data_source("images:d?resize=" + "0" * 5000 + "8").image_folder.resize, 8)
        for spec, why in [("synthetic:" + "1" * 5000, "positive integers joined by 'x'"),
                          ("synthetic:3,seed=" + "1" * 5000, "below 2^64"),
                          ("images:d?samples=" + "1" * 5000, "must be a positive integer")]:
            with self.subTest(spec=spec[:30]):
                with self.assertRaises(recal.RecalError) as caught:
                    recal.data_source(spec)
                self.assertIn(why, caught.exception.message)


if __name__ == "__main__":
    unittest.main()
