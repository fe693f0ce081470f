"""``python -m retryd``."""

from retryd.cli import main

main()
