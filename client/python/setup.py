"""Build hook of the `recal` package (metadata: pyproject.toml).

The gRPC stubs under recal/_proto/ are not in git: the CMake build generates them from
proto/ (target recal_python: protoc, grpc_python_plugin, fix_imports.cmake), and the wheel
and the sdist carry them. So build the project (or just that target) before packaging:

    cmake --build build --target recal_python
    pip install ./client/python

An sdist made that way holds the stubs and builds anywhere without protoc.
"""

import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
STUBS = ["recal/_proto/recal/v1/recal_pb2.py", "recal/_proto/recal/v1/recal_pb2_grpc.py",
         "recal/_proto/recal/v1/report_pb2.py", "recal/_proto/grpc/health/v1/health_pb2.py",
         "recal/_proto/grpc/health/v1/health_pb2_grpc.py"]

missing = [path for path in STUBS if not os.path.exists(os.path.join(HERE, path))]
if missing:
    sys.exit("recal: the generated gRPC stubs are missing (%s); generate them first with "
             "`cmake --build build --target recal_python` in the source checkout (see "
             "client/python/README.md, 'Installing')" % ", ".join(missing))

setup()
