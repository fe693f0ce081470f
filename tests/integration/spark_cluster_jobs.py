"""Run several ``retryd spark`` commands as one Spark application on a cluster.

``python -m tests.integration.spark_cluster_jobs MASTER CONF_JSON JOBS_JSON OUT_JSON``: starts
the session the CLI starts for ``--master MASTER`` (``build_session`` with the ``--spark-conf``
settings in CONF_JSON), then runs each command of JOBS_JSON (``{name: [args...]}``) through the
CLI, which runs on the active session, and writes ``{name: {"exit": code, "output": text,
"seconds": s}}`` to OUT_JSON. One application instead of one per command: a driver JVM and its
executors start once, not three times (45-80 s each on a loaded 2-core machine).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from retryd.cli import app
from retryd.pipeline.session import build_session, stop_session


def main(master: str, conf_json: str, jobs_json: str, out_json: str) -> int:
    conf = json.loads(conf_json)
    jobs: dict[str, list[str]] = json.loads(jobs_json)
    results: dict[str, dict[str, object]] = {}
    started = time.monotonic()
    spark = build_session(master, "retryd", conf)
    results["session"] = {"exit": 0, "output": "", "seconds": time.monotonic() - started}
    try:
        for name, args in jobs.items():
            started = time.monotonic()
            done = CliRunner().invoke(app, args)
            results[name] = {
                "exit": done.exit_code,
                "output": done.output + (repr(done.exception) if done.exception else ""),
                "seconds": time.monotonic() - started,
            }
            if done.exit_code != 0:
                break
    finally:
        stop_session(spark)
        Path(out_json).write_text(json.dumps(results))
    return 0 if all(r["exit"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
