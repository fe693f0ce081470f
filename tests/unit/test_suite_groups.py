"""How a parallel run groups the suite's tests (tests/conftest.py): the timed and
fault-injection tests share one group, so they never run beside each other; the Spark tests
share another (one Spark session); a file's tests stay on one worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from tests.conftest import OWN_GROUP_PATHS, ROOT, SERIAL_GROUP, SPARK_GROUP, group_of, scope_of


def test_timed_and_fault_injection_tests_share_the_serial_group() -> None:
    for path in (
        "tests/chaos/test_sigterm.py",
        "tests/integration/test_bench_quick.py",
        "tests/integration/test_circuit_outage.py",
    ):
        assert group_of(path) == SERIAL_GROUP, path
    for path in (
        "tests/integration/test_spark_archive.py",
        "tests/integration/test_foreign_dead_letters.py",
        "tests/integration/test_bench_datasource_quick.py",
    ):
        assert group_of(path) == SPARK_GROUP, path


def test_other_tests_group_by_file_and_the_browser_tests_by_package() -> None:
    assert (
        group_of("tests/integration/test_sidecar_api.py") == "tests/integration/test_sidecar_api.py"
    )
    assert group_of("tests/unit/test_policy.py") == "tests/unit/test_policy.py"
    assert group_of("tests/browser/test_flow.py") == group_of("tests/browser/test_sign_in.py")


def test_every_module_using_the_spark_session_is_in_the_spark_group() -> None:
    # one Spark session (JVM) per worker: a module outside the group would start a second
    # (but a module of its own group: one more session, in the other worker, on purpose)
    for module in sorted((ROOT / "tests").rglob("test_*.py")):
        if module.resolve() == Path(__file__).resolve():
            continue
        text = module.read_text(encoding="utf-8")
        if "spark_support" in text or "SparkSession" in text:
            rel = Path(module).relative_to(ROOT).as_posix()
            assert group_of(rel) == (rel if rel in OWN_GROUP_PATHS else SPARK_GROUP), rel


def test_the_spark_cluster_tests_run_beside_the_serial_group() -> None:
    path = "tests/integration/test_spark_cluster.py"
    assert path in OWN_GROUP_PATHS
    assert group_of(path) == path


def test_node_ids_map_to_their_files_group() -> None:
    assert scope_of("tests/chaos/test_sigterm.py::test_x[a::b]") == SERIAL_GROUP
    assert scope_of("tests/integration/test_spark_report.py::test_y@spark") == SPARK_GROUP
    assert scope_of("tests/unit/test_routing.py::TestA::test_z") == "tests/unit/test_routing.py"


def test_a_parallel_run_keeps_each_group_on_one_worker(tmp_path: Path) -> None:
    """The real scheduler: ``pytest -n 2 --dist loadgroup`` (as scripts/test runs the suite)
    on two files; each file's tests all ran on one worker. With xdist's mark-based grouping
    under pytest 9.2 they alternated between the workers."""
    files = ["tests/unit/test_suite_groups.py", "tests/unit/test_routing.py"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider", "-k", "not parallel_run", *files],
        cwd=ROOT,
        env={**os.environ, "RETRYD_TEST_BOOTSTRAP": "127.0.0.1:9"},  # unit tests: no broker
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, path in re.findall(r"\[(gw\d+)\].*? PASSED (\S+?)::", out.stdout):
        workers[path].add(worker)
    assert set(workers) == set(files), out.stdout[-3000:]
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
