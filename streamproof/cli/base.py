"""What every command shares: the typer apps, the consoles, the one-line errors, the common options."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from streamproof.errors import StreamproofError, first_line
from streamproof.infra.common import default_state_dir

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Exactly-once Kafka -> Spark -> Delta pipelines, and the proof.",
)
infra_app = typer.Typer(no_args_is_help=True, help="Local Apache Kafka (KRaft) and PostgreSQL for pipelines and tests.")
app.add_typer(infra_app, name="infra")
checkpoint_app = typer.Typer(no_args_is_help=True, help="Inspect, back up, restore or rebuild a pipeline's checkpoint.")
app.add_typer(checkpoint_app, name="checkpoint")

# Off a terminal (CI logs, pipes) rich would wrap at 80 columns and split the per-batch lines.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 120)
error_console = Console(stderr=True, highlight=False, soft_wrap=True)
F = TypeVar("F", bound=Callable[..., Any])

StateDir = Annotated[Path | None, typer.Option("--state-dir", help="State folder (default .streamproof).")]


def friendly_errors(command: F) -> F:
    """Turn streamproof's own errors and predictable Spark failures into one line and an exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except StreamproofError as error:
            error_console.print(f"error: {error}", markup=False)
            raise typer.Exit(error.exit_code) from None
        except KeyboardInterrupt:
            error_console.print("interrupted")
            raise typer.Exit(130) from None
        except Exception as error:  # Spark/Py4J errors: the first line says what happened
            if type(error).__module__.startswith(("pyspark", "py4j")):
                error_console.print(f"error: Spark: {first_line(error, limit=400)}", markup=False)
                raise typer.Exit(1) from None
            raise

    return wrapper  # type: ignore[return-value]


def state_path(state_dir: Path | None) -> Path:
    return state_dir.resolve() if state_dir else default_state_dir()


def fraction(name: str) -> Callable[[float | None], float | None]:
    def check(value: float | None) -> float | None:
        if value is not None and not 0.0 <= value <= 1.0:
            raise typer.BadParameter(f"{value} is not a fraction between 0 and 1", param_hint=name)
        return value

    return check


def emit_plain(line: str) -> None:
    console.print(line, markup=False)


def write_output(path: Path | None, text: str) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        console.print(f"wrote {path}")


PipelineFile = Annotated[Path, typer.Argument(help="Pipeline file (TOML).")]
