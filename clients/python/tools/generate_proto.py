#!/usr/bin/env python3
"""Regenerates fencelock/client_pb2.py from crates/types/proto/client.proto.

Run from anywhere, with grpcio-tools installed (for generation only; the
package itself needs only protobuf):

    python3 -m pip install "grpcio-tools==1.62.*"
    python3 clients/python/tools/generate_proto.py [PROTO]

PROTO defaults to the repository's crates/types/proto/client.proto.
grpcio-tools 1.62 bundles protoc 25.1, whose generated code imports with
every protobuf runtime from 4.21 on (checked with 4.21, 5.29, 6.33, 7.36).
Newer grpcio-tools emit code that checks that the runtime is at least as new
as the generator, which would break the `protobuf>=4.21` dependency of
pyproject.toml.

The proto file is compiled as `fencelock/client.proto`, so that it registers
under that name in protobuf's default descriptor pool and cannot clash with
another project's `client.proto`.
"""

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "fencelock")
PROTO = os.path.join(HERE, "..", "..", "..", "crates", "types", "proto", "client.proto")


def main() -> int:
    proto = sys.argv[1] if len(sys.argv) > 1 else PROTO
    with tempfile.TemporaryDirectory() as scratch:
        source = os.path.join(scratch, "src")
        out = os.path.join(scratch, "out")
        os.makedirs(os.path.join(source, "fencelock"))
        os.makedirs(out)
        shutil.copy(proto, os.path.join(source, "fencelock", "client.proto"))
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I" + source,
            "--python_out=" + out,
            os.path.join(source, "fencelock", "client.proto"),
        ]
        subprocess.run(command, check=True)
        target = os.path.normpath(os.path.join(PACKAGE, "client_pb2.py"))
        shutil.copy(os.path.join(out, "fencelock", "client_pb2.py"), target)
        print("wrote", target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
