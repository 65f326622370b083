"""`python -m dpfl.cli`: the `dpfl` command."""

from dpfl.cli import main

main()
