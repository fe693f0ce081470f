"""Run the pipeline jobs under ``spark-submit`` on any cluster::

    JOB=$(python -c 'import retryd.pipeline.__main__ as m; print(m.__file__)')
    spark-submit --master yarn "$JOB" report --out /data/retryd-report

Takes the same arguments as ``retryd spark``; the master and resources come from
``spark-submit``. retryd (with its ``spark`` extra) must be installed on the driver and on
every executor: the data source's tasks import it there.
"""

from __future__ import annotations

from retryd.cli.spark import spark_app

if __name__ == "__main__":
    spark_app(prog_name="retryd-spark")
