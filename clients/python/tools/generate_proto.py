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

protoc scopes enum values as siblings of their enum (C++ rules), so two
enums of the package may not share a value name; the Rust build's pure
parser does not check that, and client.proto has such names
(`AcquireOutcome.GRANTED` and `WatchEventKind.GRANTED`). The copy compiled
here renames the values of every enum that has one of another enum's names,
prefixing them with the enum's name in upper snake case
(`WATCH_EVENT_KIND_GRANTED`): enum values travel as numbers, so the wire
format is the same, and the Python code uses the numbers of such enums.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "fencelock")
PROTO = os.path.join(HERE, "..", "..", "..", "crates", "types", "proto", "client.proto")


def _upper_snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


def protoc_safe(text: str) -> str:
    """``text`` with the values of every enum that reuses a value name of an
    earlier enum renamed ``ENUM_NAME_VALUE`` (see the module doc)."""
    seen = set()
    out = text
    for match in re.finditer(r"^enum (\w+) \{(.*?)^\}", text, re.M | re.S):
        name, body = match.group(1), match.group(2)
        values = re.findall(r"^\s*(\w+)\s*=\s*-?\d+\s*;", body, re.M)
        if seen.intersection(values):
            prefix = _upper_snake(name) + "_"

            def rename(value: "re.Match[str]") -> str:
                old = value.group(2)
                return value.group(1) + (old if old.startswith(prefix) else prefix + old) + value.group(3)

            renamed = re.sub(r"^(\s*)(\w+)(\s*=)", rename, body, flags=re.M)
            out = out.replace(match.group(0), match.group(0).replace(body, renamed), 1)
            values = re.findall(r"^\s*(\w+)\s*=\s*-?\d+\s*;", renamed, re.M)
        seen.update(values)
    return out


def main() -> int:
    proto = sys.argv[1] if len(sys.argv) > 1 else PROTO
    with tempfile.TemporaryDirectory() as scratch:
        source = os.path.join(scratch, "src")
        out = os.path.join(scratch, "out")
        os.makedirs(os.path.join(source, "fencelock"))
        os.makedirs(out)
        with open(proto, encoding="utf-8") as f:
            text = protoc_safe(f.read())
        with open(os.path.join(source, "fencelock", "client.proto"), "w", encoding="utf-8") as f:
            f.write(text)
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
