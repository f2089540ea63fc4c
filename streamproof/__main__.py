"""``python -m streamproof`` = the ``streamproof`` command (the harness starts children this way)."""

from streamproof.cli import main

main()
