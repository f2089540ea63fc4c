"""The pipeline file: TOML text <-> :class:`~streamproof.config.pipeline.PipelineSpec`.

The file format is DESIGN.md's. Spark's own option names are accepted as aliases wherever Spark has
one (``startingOffsets`` for ``starting_offsets``), and any ``"kafka.*"`` key in ``[source]`` is passed
to Spark's Kafka connector verbatim (SASL/SSL settings, timeouts). ``${NAME}`` anywhere in a string is
replaced by the environment variable ``NAME`` (for secrets); a missing variable is an error. A password
is accepted only as such a reference, and a dumped file writes the reference back, never the secret.

Every problem is reported as one line naming the key, e.g.
``orders.toml: sink.mode: 'apend' is not one of append, merge``.

Example::

    >>> spec = parse_pipeline('''
    ... name = "orders"
    ... [source]
    ... kind = "kafka"
    ... topic = "orders"
    ... [transform]
    ... schema = "event_id STRING, order_id STRING"
    ... required = ["event_id"]
    ... [sink]
    ... kind = "delta"
    ... path = "/tmp/orders"
    ... ''')
    >>> spec.source.starting_offsets, spec.guarantee
    ('earliest', 'exactly-once')
    >>> again = parse_pipeline(dump_pipeline(spec))
    >>> again.sink == spec.sink and again.quarantine_path == spec.quarantine_path
    True
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from streamproof.config.pipeline import PipelineSpec
from streamproof.config.sinks import SINK_KINDS
from streamproof.config.sources import SOURCE_KINDS
from streamproof.errors import ConfigError
from streamproof.storage.location import Location

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _interpolate_env(value: Any, where: str, references: dict[str, str]) -> Any:
    """Replace ``${NAME}`` by the variable's value; ``references`` maps each value so made back to its text."""
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(f"{where}: environment variable {name} is not set (referenced as ${{{name}}})")
            return os.environ[name]

        resolved = _ENV_REFERENCE.sub(substitute, value)
        if resolved != value:
            references[resolved] = value
        return resolved
    if isinstance(value, dict):
        return {
            key: _interpolate_env(item, f"{where}.{key}" if where else key, references) for key, item in value.items()
        }
    if isinstance(value, list):
        return [_interpolate_env(item, f"{where}[{index}]", references) for index, item in enumerate(value)]
    return value


def _location(parts: tuple[int | str, ...]) -> str:
    """``("sinks", 1, "postgres", "table")`` -> ``sinks[1].table``: validator names and union tags dropped."""
    text = ""
    for index, part in enumerate(parts):
        if str(part).startswith("function-after"):
            continue
        if isinstance(part, int):
            text += f"[{part}]"
        elif part in SINK_KINDS and index > 0 and (parts[index - 1] == "sink" or isinstance(parts[index - 1], int)):
            continue  # the discriminator of the sink union, not a key of the file
        elif part in SOURCE_KINDS and index > 0 and parts[index - 1] == "source":
            continue  # the discriminator of the source union
        else:
            text += f".{part}" if text else str(part)
    return text


def _first_error_line(error: ValidationError) -> str:
    first = error.errors()[0]
    location = _location(first["loc"])
    kind, message = first["type"], first["msg"]
    given = first.get("input")
    kinds = SOURCE_KINDS if location == "source" else SINK_KINDS
    if kind == "union_tag_invalid":
        location = f"{location}.kind"
        message = f"{first.get('ctx', {}).get('tag')!r} is not one of {', '.join(kinds)}"
    elif kind == "union_tag_not_found":
        location, message = f"{location}.kind", f"missing (one of {', '.join(kinds)})"
    elif kind == "literal_error":
        allowed = first.get("ctx", {}).get("expected", "")
        allowed = allowed.replace("'", "").replace(" or ", ", ")
        message = f"{given!r} is not one of {allowed}"
    elif kind == "extra_forbidden":
        message = "unknown key (check its spelling against DESIGN.md's pipeline file)"
    elif kind == "missing":
        message = "missing (required)"
    elif kind == "value_error":
        message = message.removeprefix("Value error, ")
    elif isinstance(given, str | int | float | bool):
        message = f"{given!r}: {message[0].lower()}{message[1:]}"
    nested = re.match(r"^([a-z_.]+): (.*)$", message)
    if nested and kind == "value_error":  # a model-level check names its own key: "required: ..."
        location, message = ".".join(p for p in (location, nested.group(1)) if p), nested.group(2)
    return f"{location}: {message}" if location else message


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def dump_pipeline(spec: PipelineSpec) -> str:
    """The pipeline as TOML text that :func:`parse_pipeline` reads back to an equal spec.

    Paths are written as resolved absolute paths, so the file works from any directory. A value that came
    from ``${NAME}`` is written as ``${NAME}`` again, and a password as its variable (``password_env``): the
    text never holds a secret.
    """
    references = spec._env_references
    data = spec.model_dump(exclude_none=True, exclude={"sink", "sinks", "lookups"})
    data["checkpoint"] = str(spec.checkpoint_dir)
    data["transform"]["schema"] = data["transform"].pop("schema_")
    data["transform"]["quarantine"] = str(spec.quarantine_path)
    data["source"].update(data["source"].pop("kafka_options", {}))
    lines = _toml_pairs({key: data[key] for key in ("name", "guarantee", "checkpoint")}, references)
    for table in ("source", "transform", "trigger", "spark", "metrics", "retry"):
        lines += ["", f"[{table}]", *_toml_pairs(data[table], references)]
    for sink in spec.sink_specs:
        sink_data = sink.model_dump(exclude_none=True)
        if "path" in sink_data:
            sink_data["path"] = str(spec.resolve_path(sink_data["path"]))
        sink_data.update(sink_data.pop("kafka_options", {}))
        lines += ["", "[sink]" if spec.sink is not None else "[[sinks]]", *_toml_pairs(sink_data, references)]
    for lookup in spec.lookups:
        lookup_data = {**lookup.model_dump(), "path": str(spec.resolve_path(lookup.path))}
        lines += ["", "[[lookups]]", *_toml_pairs(lookup_data, references)]
    return "\n".join(lines) + "\n"


def _toml_pairs(table: dict[str, Any], references: dict[str, str]) -> list[str]:
    return [
        f"{_toml_key(key)} = {_toml_value(references.get(value, value) if isinstance(value, str) else value)}"
        for key, value in table.items()
    ]


_PASSWORD_REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def _password_from_environment_only(raw: dict[str, Any]) -> None:
    """Turn ``password = "${NAME}"`` into ``password_env = "NAME"``; refuse a literal password.

    The spec then never holds the secret itself, so no log line, report or dumped file can leak it; the
    sink reads the variable when it connects.
    """
    tables = [("sink", raw.get("sink"))] + [(f"sinks[{i}]", t) for i, t in enumerate(raw.get("sinks") or [])]
    for where, table in tables:
        if not isinstance(table, dict) or "password" not in table:
            continue
        reference = _PASSWORD_REFERENCE.match(str(table["password"]))
        if reference is None:
            raise ConfigError(
                f"{where}.password: passwords are read from the environment only: write password = "
                '"${PGPASSWORD}" and export PGPASSWORD'
            )
        if reference.group(1) not in os.environ:
            raise ConfigError(f"{where}.password: environment variable {reference.group(1)} is not set")
        del table["password"]
        table["password_env"] = reference.group(1)


def parse_pipeline(text: str, *, source_name: str = "<pipeline>", base_dir: Path | None = None) -> PipelineSpec:
    """Parse and validate pipeline TOML text; raise :class:`ConfigError` with one line on any problem."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source_name}: not valid TOML: {error}") from None
    return pipeline_from_tables(raw, source_name=source_name, base_dir=base_dir)


def pipeline_from_tables(
    raw: dict[str, Any], *, source_name: str = "<pipeline>", base_dir: Path | None = None
) -> PipelineSpec:
    """Validate a pipeline given as its tables (what TOML parses to); :class:`ConfigError` with one line.

    >>> pipeline_from_tables({"name": "p", "source": {"kind": "kafka", "topic": "t"},
    ...                       "transform": {"schema": "id STRING"},
    ...                       "sink": {"kind": "delta", "path": "/t", "mode": "apend"}})
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: <pipeline>: sink.mode: 'apend' is not one of append, merge
    """
    raw = json.loads(json.dumps(raw, default=str))  # a copy, paths as text
    try:
        _password_from_environment_only(raw)
        references: dict[str, str] = {}
        raw = _interpolate_env(raw, "", references)
    except ConfigError as error:
        raise ConfigError(f"{source_name}: {error}") from None
    try:
        spec = PipelineSpec.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(f"{source_name}: {_first_error_line(error)}") from None
    if spec.transform.avro_schema is not None:  # a file the pipeline reads, like the paths it writes
        resolved = Location.resolved(spec.transform.avro_schema, base_dir or Path.cwd())
        spec = spec.model_copy(update={"transform": spec.transform.model_copy(update={"avro_schema": str(resolved)})})
    spec._base_dir = base_dir or Path.cwd()
    spec._source_name = source_name
    spec._env_references = references
    return spec


def load_pipeline(path: str | Path) -> PipelineSpec:
    """Read a pipeline file; relative paths inside it are relative to the current directory.

    >>> load_pipeline("no/such/pipeline.toml")
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: no/such/pipeline.toml: no such pipeline file
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such pipeline file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{file}: cannot read it: {error}") from None
    return parse_pipeline(text, source_name=str(file), base_dir=Path.cwd())
