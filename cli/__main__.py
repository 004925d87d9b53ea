"""``python -m cli``: the ``webloop`` command."""

from cli.app import main

main()
