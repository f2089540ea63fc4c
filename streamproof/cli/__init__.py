"""``streamproof ...``: the command line of DESIGN.md. Each command parses its arguments and makes one call into
a room of the package; nothing here computes.

Exit codes: 0 success; 1 a verification or proof found loss or duplicates; 2 bad input (config,
arguments, missing set-up). A predictable mistake prints one ``error:`` line, never a traceback.

Example::

    $ streamproof verify examples/orders_to_delta.toml --json report.json
"""

# isort: off
# Registration order is the order `streamproof --help` lists the commands in: the data flow first.
from streamproof.cli.base import app
from streamproof.cli import generate, pipeline, operations, infra
# isort: on

__all__ = ["app", "generate", "infra", "main", "operations", "pipeline"]


def main() -> None:
    """Console-script entry point."""
    app(prog_name="streamproof")
