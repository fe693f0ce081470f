"""``retryd`` command line. Each sub-command lives in its own module and registers on ``app``."""

from __future__ import annotations

# Sub-command modules register themselves on import.
from retryd.cli import demo as _demo  # noqa: F401
from retryd.cli import dev as _dev  # noqa: F401
from retryd.cli import health as _health  # noqa: F401
from retryd.cli import replay as _replay  # noqa: F401
from retryd.cli import share_lag as _share_lag  # noqa: F401
from retryd.cli import sidecar as _sidecar  # noqa: F401
from retryd.cli import spark as _spark  # noqa: F401
from retryd.cli import topics as _topics  # noqa: F401
from retryd.cli import version as _version  # noqa: F401
from retryd.cli import worker as _worker  # noqa: F401
from retryd.cli.app import app


def main() -> None:
    app()
