"""The installed package, as `pip install ./clients/python` made it."""

import os
import subprocess
import sys

import pytest


def test_the_installed_package_imports_with_its_protobuf():
    # Outside the source tree, so that the installed copy is the one found.
    code = (
        "import fencelock, google.protobuf\n"
        "from fencelock import client_pb2 as pb\n"
        "r = pb.Request(id=3, acquire=pb.AcquireRequest(key=b'k', lease_ms=1000, owner=b'o'))\n"
        "assert pb.Request.FromString(r.SerializeToString()) == r\n"
        "w = pb.Request(id=4, watch=pb.WatchRequest(prefix=b'p', start=True))\n"
        "assert pb.Request.FromString(w.SerializeToString()) == w\n"
        "assert {'Watch', 'Observer', 'WatchBatch', 'WatchEvent', 'Leader', 'LeaderChange'} <= set(fencelock.__all__)\n"
        "assert all(hasattr(fencelock, name) for name in fencelock.__all__)\n"
        "print(fencelock.__file__, google.protobuf.__version__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True)
    if "No module named 'fencelock'" in result.stderr:
        pytest.skip("fencelock is not installed: pip install ./clients/python")
    assert result.returncode == 0, result.stderr
    print(result.stdout)


def test_the_generated_code_matches_the_proto():
    # Every message, field number and enum of client.proto is in client_pb2,
    # and no other: a client_pb2.py left stale by a change of the proto
    # fails here.
    import re
    from pathlib import Path

    from fencelock import client_pb2 as pb

    proto = Path(__file__).resolve().parents[3] / "crates" / "types" / "proto" / "client.proto"
    text = proto.read_text()
    messages = set(re.findall(r"^message (\w+)", text, re.M))
    stale = "fencelock/client_pb2.py is stale: run `python3 clients/python/tools/generate_proto.py`"
    assert messages and messages == set(pb.DESCRIPTOR.message_types_by_name.keys()), stale
    for name in messages:
        match = re.search(r"^message %s \{(\}|.*?^\})" % name, text, re.M | re.S)
        fields = match.group(1)
        numbers = {int(n) for n in re.findall(r"=\s*(\d+);", fields)}
        generated = {f.number for f in pb.DESCRIPTOR.message_types_by_name[name].fields}
        assert numbers == generated, f"{stale} (message {name})"
    enums = set(re.findall(r"^enum (\w+)", text, re.M))
    assert enums == set(pb.DESCRIPTOR.enum_types_by_name.keys()), stale
    for name in enums:
        body = re.search(r"^enum %s \{(.*?)^\}" % name, text, re.M | re.S).group(1)
        values = set(re.findall(r"^\s*(\w+)\s*=\s*(\d+);", body, re.M))
        generated = {(v.name, str(v.number)) for v in pb.DESCRIPTOR.enum_types_by_name[name].values}
        assert values == generated, f"{stale} (enum {name})"
