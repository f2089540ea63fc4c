"""The job file read before it runs: every production address it writes down, and what it asks that a proof cannot
give, refused before anything starts.

A job names its addresses in string literals (``"s3://prod/checkpoints/orders"``, ``"broker1:9092"``), often in a
module of its own beside it (``settings.py``). :func:`scan_job` reads the job and those modules with ``ast`` (nothing
is imported or run), finds each literal that is a remote URI or a broker list, and asks :class:`AddressMaps` where it
goes: one that no map covers is refused, naming its file and line, the option or call it is given to, and the flag
that maps it. So is ``SparkSession.builder.remote(...)`` (Spark Connect runs the job's code in a server's worker,
outside any process streamproof can crash) and a continuous trigger (no micro-batches to crash between). What is
built at run time (an address read from the environment) is checked again where the job hands it to Spark
(:mod:`streamproof.jobs.patches`).

Example::

    >>> import tempfile, pathlib
    >>> job = pathlib.Path(tempfile.mkdtemp()) / "job.py"
    >>> _ = job.write_text('q = df.writeStream.option("checkpointLocation", "s3://prod/ck/orders")\\n')
    >>> [refusal.line() for refusal in scan_job(job, AddressMaps())]  # doctest: +ELLIPSIS
    [".../job.py:1: checkpointLocation: 's3://prod/ck/orders' is a production address no --map covers: add --map \
s3://prod/=<a local folder or s3a://...>"]
"""

from __future__ import annotations

import ast
import hashlib
import re
import traceback
from dataclasses import dataclass
from pathlib import Path

from streamproof.errors import ConfigError
from streamproof.jobs.maps import AddressMaps, Unmapped, is_remote, looks_like_brokers, scheme_of
from streamproof.sinks.python import your_exception


class JobError(ConfigError):
    """The job failed on its own (a syntax error, an import, an exception before or in a batch): not a proof result.
    Its one line names the job's file and line; the traceback is in a file it names (exit 2)."""


@dataclass(frozen=True)
class Refusal:
    """One thing the job asks for that a proof refuses, where it asks it."""

    file: Path
    line_number: int
    text: str

    def line(self) -> str:
        return f"{self.file}:{self.line_number}: {self.text}"


def job_digest(job: Path) -> str:
    """The sha256 of the job file: the same before and after a proof (streamproof never edits it).

    >>> len(job_digest(Path(__file__)))
    64
    """
    return hashlib.sha256(job.read_bytes()).hexdigest()


def parsed(job: Path) -> ast.Module:
    """The job's syntax tree; a syntax error is the job's own, in one line with its file and line."""
    try:
        return ast.parse(job.read_text(encoding="utf-8"), filename=str(job))
    except SyntaxError as error:
        raise JobError(f"job error: {job}:{error.lineno}: SyntaxError: {error.msg}") from None
    except OSError as error:
        raise ConfigError(f"{job}: cannot read the job file: {error.strerror or error}") from None


def own_modules(job: Path, tree: ast.Module) -> list[Path]:
    """The modules beside the job that it imports (``import settings``, ``from lib import x``): read with it."""
    found = []
    for node in ast.walk(tree):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            for candidate in (
                job.parent.joinpath(*parts).with_suffix(".py"),
                job.parent.joinpath(*parts, "__init__.py"),
            ):
                if candidate.is_file() and candidate not in found:
                    found.append(candidate)
    return found


def _context(parents: dict[int, ast.AST], node: ast.AST) -> str:
    """Where a literal is given: ``.option("checkpointLocation", <it>)`` -> ``checkpointLocation``; ``.start(<it>)``
    -> ``start(path)``; ``CHECKPOINT = <it>`` -> ``CHECKPOINT``; a keyword -> its name."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.keyword) and parent.arg:
        return parent.arg
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute):
        method = parent.func.attr
        if method == "option" and len(parent.args) == 2 and parent.args[1] is node:
            key = parent.args[0]
            return str(key.value) if isinstance(key, ast.Constant) else "option"
        return f"{method}(...)"
    if isinstance(parent, ast.Assign) and parent.targets and isinstance(parent.targets[0], ast.Name):
        return parent.targets[0].id
    if isinstance(parent, ast.Dict):
        index = next((i for i, value in enumerate(parent.values) if value is node), None)
        named = parent.keys[index] if index is not None else None
        if isinstance(named, ast.Constant):
            return str(named.value)
    return "a string"


def _literals(tree: ast.Module) -> list[tuple[ast.Constant, str]]:
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            holder = parents.get(id(node))
            where = _context(parents, holder if isinstance(holder, ast.JoinedStr) else node)
            found.append((node, where))
    return found


def _asks_what_a_proof_cannot_give(tree: ast.Module) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr == "remote":
            found.append(
                (
                    node.lineno,
                    "SparkSession.builder.remote(...) is Spark Connect: the job's code would run in a server's worker "
                    "that streamproof cannot crash or watch; build the session without .remote (prove it in classic "
                    "PySpark)",
                )
            )
        if node.func.attr == "trigger" and any(keyword.arg == "continuous" for keyword in node.keywords):
            found.append(
                (
                    node.lineno,
                    "trigger(continuous=...) has no micro-batches to crash between, and Spark gives it at-least-once "
                    "only: use processingTime or availableNow",
                )
            )
    return found


def scan_job(job: Path, maps: AddressMaps) -> list[Refusal]:
    """Every refusal the job's text (and its own modules') earns with these maps, in file and line order."""
    refusals = []
    tree = parsed(job)
    for file, module in [(job, tree), *((path, parsed(path)) for path in own_modules(job, tree))]:
        for line_number, text in _asks_what_a_proof_cannot_give(module):
            refusals.append(Refusal(file, line_number, text))
        for node, where in _literals(module):
            value = str(node.value).strip()
            try:
                if looks_like_brokers(value):
                    maps.servers(value, where)
                elif is_remote(value) and scheme_of(value) is not None:
                    if value.startswith("jdbc:"):
                        maps.jdbc_url(value, where)
                    elif scheme_of(value) in ("postgresql", "postgres"):
                        maps.jdbc_url("jdbc:" + value.replace("postgres://", "postgresql://", 1), where)
                    else:
                        maps.path(value, where, writing=False)
            except Unmapped as unmapped:
                refusals.append(Refusal(file, node.lineno, str(unmapped)))
    return sorted(refusals, key=lambda refusal: (str(refusal.file), refusal.line_number))


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def where_in_job(error: BaseException, job: Path) -> str:
    """``file:line`` of the innermost frame in the job's folder (its file or its own modules): in the traceback, or in
    the text of a Python worker's traceback that Spark wraps a failed task's error in."""
    folder, ours = str(job.parent), str(Path(__file__).resolve().parents[1])

    def mine(filename: str) -> bool:
        return filename.startswith(folder) and not filename.startswith(ours)

    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}:{error.lineno}"
    in_text = [(name, line) for name, line in _FRAME.findall(str(error)) if mine(name)]
    if in_text:
        return f"{in_text[-1][0]}:{in_text[-1][1]}"
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if mine(frame.filename)]
    if not frames:
        return str(job)
    return f"{frames[-1].filename}:{frames[-1].lineno}"


def one_line(error: BaseException) -> str:
    """The job's exception in one line: its own, or the last Python exception Spark wraps a failed task's in.

    >>> one_line(KeyError("customer"))
    "KeyError: 'customer'"
    """
    return your_exception(error)
