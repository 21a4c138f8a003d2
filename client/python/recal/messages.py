"""Messages as plain Python values, for people and for programs: recal.to_dict, recal.to_json.

protobuf's json_format (MessageToDict, MessageToJson) and the server's report artifact,
printed the same way in C++, follow proto3's JSON mapping, which writes every int64 as a
string ("batches": "3") for JavaScript's sake. A dict in Python, or a report a person reads,
should say 3. Here: ints as ints, enums by name, every field under its .proto name with
defaults included (as the server's report prints them), unset sub-messages left out,
timestamps as RFC 3339 strings, bytes as base64.
"""

import base64
import json
import math
import struct

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from recal._proto.recal.v1 import report_pb2

# Well-known types whose JSON form is a string (the same as json_format's).
_AS_STRING = frozenset(("google.protobuf.Timestamp", "google.protobuf.Duration"))


def to_dict(message):
    """A dict of `message` (a RunReport, Job, ...): see the module's docstring."""
    return {field.name: _field_value(field, getattr(message, field.name))
            for field in message.DESCRIPTOR.fields if not _unset(message, field)}


def to_json(message, indent=2):
    """to_dict(message) as JSON text. Non-finite doubles become "NaN", "Infinity" and
    "-Infinity", as in proto3's JSON, so that any JSON parser reads the text."""
    return json.dumps(_finite(to_dict(message)), indent=indent) + "\n"


def read_report(path):
    """The RunReport in a report JSON file: the server's artifact (int64 as strings) or one
    written by recalibrate(report=...) (ints as ints). Fields a newer server adds are
    skipped."""
    with open(path) as f:
        return parse_report(f.read())


def parse_report(text):
    return json_format.Parse(text, report_pb2.RunReport(), ignore_unknown_fields=True)


def _unset(message, field):
    """A field with presence (a sub-message, a oneof member, a proto3 `optional`) that is
    not set; other fields are always there, defaults included."""
    if field.label == FieldDescriptor.LABEL_REPEATED:
        return False
    if field.message_type is not None or field.containing_oneof is not None:
        return not message.HasField(field.name)
    return False


def _field_value(field, value):
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        return {key: _single(value_field, item) for key, item in value.items()}
    if field.label == FieldDescriptor.LABEL_REPEATED:
        return [_single(field, item) for item in value]
    return _single(field, value)


def _single(field, value):
    if field.message_type is not None:
        if field.message_type.full_name in _AS_STRING:
            return value.ToJsonString()
        return to_dict(value)
    if field.enum_type is not None:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else value  # a number this client does not know
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    if field.type == FieldDescriptor.TYPE_FLOAT:
        return _shortest_float32(value)
    return value  # int, float (double), bool, str: as Python has them


def _shortest_float32(value):
    """A float field holds a float32: 0.485 reads back as 0.48500001430511475; the shortest
    decimal that is the same float32 (as json_format prints it)."""
    if not math.isfinite(value):
        return value
    exact = struct.pack("<f", value)
    for digits in range(6, 10):
        rounded = float("%.*g" % (digits, value))
        if struct.pack("<f", rounded) == exact:
            return rounded
    return value


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value
