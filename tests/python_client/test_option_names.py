"""recal.specs: the engine options' names are the proto enums' (report.proto), lowercase,
UNSPECIFIED left out, as common/enum_names.h gives them to C++. No server."""
import unittest

from recal import specs
from recal._proto.recal.v1 import report_pb2


def proto_names(enum):
    return sorted(name.lower() for name in enum.keys() if not name.endswith("_UNSPECIFIED"))


class OptionNames(unittest.TestCase):
    def test_names_are_exactly_the_protos(self):
        for names, enum in ((specs._ESTIMATORS, report_pb2.Estimator),
                            (specs._MODULES, report_pb2.ModuleMode),
                            (specs._COMPUTE_DTYPES, report_pb2.ComputeDtype),
                            (specs._MEMORY_FORMATS, report_pb2.MemoryFormat)):
            with self.subTest(enum=enum.DESCRIPTOR.name):
                self.assertEqual(sorted(names), proto_names(enum))
                for name, number in names.items():
                    self.assertEqual(enum.Name(number).lower(), name)

    def test_the_names_users_know(self):
        self.assertEqual(sorted(specs._COMPUTE_DTYPES), ["bfloat16", "float16", "float32"])
        self.assertEqual(sorted(specs._MEMORY_FORMATS), ["auto", "channels_last", "contiguous"])

    def test_string_options_go_on_the_wire_as_lowercase_names(self):
        options = specs.engine_options(compute_dtype="BFloat16", memory_format=report_pb2.CHANNELS_LAST,
                                       estimator="batch_average", modules="as_saved")
        self.assertEqual(options.compute_dtype, "bfloat16")
        self.assertEqual(options.memory_format, "channels_last")
        self.assertEqual(options.estimator, report_pb2.BATCH_AVERAGE)
        self.assertEqual(options.modules, report_pb2.AS_SAVED)

    def test_unknown_names_are_refused_with_the_allowed_ones(self):
        with self.assertRaisesRegex(ValueError, "compute_dtype 'float64' is not one of bfloat16, float16, float32"):
            specs.engine_options(compute_dtype="float64")
        with self.assertRaisesRegex(ValueError, "memory_format 'nhwc' is not one of auto, channels_last, contiguous"):
            specs.engine_options(memory_format="nhwc")


if __name__ == "__main__":
    unittest.main()
