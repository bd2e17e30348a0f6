"""`python -m mdclient` = the `mdclient` console script."""

from mdclient.cli import run

run()
