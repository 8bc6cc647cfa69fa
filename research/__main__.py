"""``python -m research``: the paper's studies as a program of their own (research/cli.py), run
from a clone of the repository."""

from research.cli import main

main()
