"""Fixtures: real fencelockd clusters (tests/harness.py).

``cluster`` is one 3-node cluster shared by the tests that leave it whole;
``new_cluster`` starts a 3-node cluster of a test's own, for the tests that
kill nodes. A failed test prints the tail of every node's log.

The tests import the package from this source tree (clients/python), ahead
of any installed copy, so that they test the code beside them.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import Cluster  # noqa: E402


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "report_" + report.when, report)


def _failed(request) -> bool:
    return any(getattr(getattr(request.node, "report_" + when, None), "failed", False)
               for when in ("setup", "call"))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory, request):
    shared = Cluster(tmp_path_factory.mktemp("shared-cluster"))
    try:
        shared.start()
        yield shared
    finally:
        shared.stop()


@pytest.fixture(autouse=True)
def _shared_logs_on_failure(request):
    yield
    if "cluster" in request.fixturenames and _failed(request):
        print(request.getfixturevalue("cluster").log_tails())


@pytest.fixture
def new_cluster(tmp_path, request):
    """Starts a 3-node cluster of this test's own (call it; extra fencelockd
    flags may be passed), stopped after the test."""
    started = []

    def start(size: int = 3, extra_args=None, client_options=None) -> Cluster:
        fresh = Cluster(tmp_path / f"cluster{len(started)}", size, extra_args, client_options)
        started.append(fresh)
        return fresh.start()

    yield start
    for fresh in started:
        if _failed(request):
            print(fresh.log_tails())
        fresh.stop()
