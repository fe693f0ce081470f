"""How a parallel run groups the suite's tests (tests/conftest.py): the timed and
fault-injection tests share one group, so they never run beside each other."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import OWN_GROUP_PATHS, ROOT, SERIAL_GROUP, group_of


def test_timed_and_fault_injection_tests_share_the_serial_group() -> None:
    for path in (
        "tests/chaos/test_sigterm.py",
        "tests/integration/test_bench_quick.py",
        "tests/integration/test_bench_datasource_quick.py",
        "tests/integration/test_circuit_outage.py",
        "tests/integration/test_spark_archive.py",
        "tests/integration/test_foreign_dead_letters.py",
    ):
        assert group_of(path) == SERIAL_GROUP, path


def test_other_tests_group_by_file_and_the_browser_tests_by_package() -> None:
    assert (
        group_of("tests/integration/test_sidecar_api.py") == "tests/integration/test_sidecar_api.py"
    )
    assert group_of("tests/unit/test_policy.py") == "tests/unit/test_policy.py"
    assert group_of("tests/browser/test_flow.py") == group_of("tests/browser/test_sign_in.py")


def test_every_module_using_the_spark_session_is_in_the_serial_group() -> None:
    # one Spark session (JVM) per worker: a module outside the group would start a second
    # (but a module of its own group: one more session, in the other worker, on purpose)
    for module in sorted((ROOT / "tests").rglob("test_*.py")):
        if module.resolve() == Path(__file__).resolve():
            continue
        text = module.read_text(encoding="utf-8")
        if "spark_support" in text or "SparkSession" in text:
            rel = Path(module).relative_to(ROOT).as_posix()
            assert group_of(rel) == (rel if rel in OWN_GROUP_PATHS else SERIAL_GROUP), rel


def test_the_spark_cluster_tests_run_beside_the_serial_group() -> None:
    path = "tests/integration/test_spark_cluster.py"
    assert path in OWN_GROUP_PATHS
    assert group_of(path) == path
