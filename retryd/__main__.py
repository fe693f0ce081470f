"""``python -m retryd`` (and the ``retryd`` command, through ``main``).

Stop signals are held before anything heavy is imported (``retryd.hosting.early``): the CLI
imports typer, pydantic and more, seconds on a busy machine, and a SIGTERM meanwhile must end a
worker, sidecar or supervisor with its documented status, not with Python's default -15.
"""

from retryd.hosting import early


def main() -> None:
    early.hold()
    from retryd.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
