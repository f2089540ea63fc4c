"""Checks shared by the sections of a pipeline file: durations, identifiers, topic names, Spark DDL schemas.

Each raises ``ValueError`` with the text a user reads after the key's name (``transform.dedup.delay: ...``).

Example::

    >>> duration_seconds("2 minutes"), schema_field_names("event_id STRING, amount DECIMAL(10, 2)")
    (120.0, ['event_id', 'amount'])
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

_DURATION = re.compile(r"^\s*\d+(\.\d+)?\s+(millisecond|second|minute|hour|day)s?\s*$", re.IGNORECASE)
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Every record's place in its source (DESIGN.md): every sink row and quarantine row carries them.
COORDINATES = ("_src_topic", "_src_partition", "_src_offset")


class Strict(BaseModel):
    """A section of the pipeline file: unknown keys are refused, values never change after loading."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def duration(value: str) -> str:
    """A duration as Spark takes it (``"2 seconds"``, ``"1 hour"``), or ``ValueError``.

    >>> duration(" 5 minutes ")
    '5 minutes'
    """
    if not _DURATION.match(value):
        raise ValueError(f"{value!r} is not a duration like '2 seconds' or '1 hour'")
    return value.strip()


def duration_seconds(text: str) -> float:
    """``"2 minutes"`` -> 120.0 (the duration forms the pipeline file accepts).

    >>> duration_seconds("1.5 seconds"), duration_seconds("2 minutes"), duration_seconds("1 hour")
    (1.5, 120.0, 3600.0)
    """
    number, unit = text.split()
    scale = {"millisecond": 0.001, "second": 1, "minute": 60, "hour": 3600, "day": 86400}[unit.lower().rstrip("s")]
    return float(number) * scale


def sql_identifier(value: str) -> str:
    """A plain SQL identifier (PostgreSQL names are interpolated into SQL, quoted: only these pass).

    >>> sql_identifier("orders_2026")
    'orders_2026'
    """
    if not IDENTIFIER.match(value) or len(value) > 63:
        raise ValueError(f"{value!r} is not a plain SQL identifier (letters, digits, '_'; at most 63)")
    return value


def topic_name(value: str) -> str:
    """A Kafka topic name.

    >>> topic_name("orders.out-1")
    'orders.out-1'
    """
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", value):
        raise ValueError(f"{value!r} is not a Kafka topic name (letters, digits, '.', '_', '-')")
    return value


def kafka_passthrough(data: Any) -> Any:
    """Move ``"kafka.*"`` keys (other than the bootstrap servers) into ``kafka_options``, verbatim as text.

    STYLE: PySpark option names; SASL/SSL settings and timeouts reach the Kafka client unchanged.

    >>> kafka_passthrough({"topic": "t", "kafka.security.protocol": "SSL", "kafka.request.timeout.ms": 30000})
    {'topic': 't', 'kafka_options': {'kafka.security.protocol': 'SSL', 'kafka.request.timeout.ms': '30000'}}
    """
    if not isinstance(data, dict):
        return data
    data = dict(data)
    passthrough = {
        key: data.pop(key)
        for key in list(data)
        if isinstance(key, str) and key.startswith("kafka.") and key != "kafka.bootstrap.servers"
    }
    for key, value in passthrough.items():
        if not isinstance(value, str | int | float | bool):
            raise ValueError(f"{key}: must be a string, number or boolean")
    data["kafka_options"] = {
        **data.get("kafka_options", {}),
        **{k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in passthrough.items()},
    }
    return data


def schema_field_type(schema_ddl: str, name: str) -> str | None:
    """The declared type of a top-level field, upper-case, or None.

    >>> schema_field_type("event_id STRING, event_time timestamp", "event_time")
    'TIMESTAMP'
    """
    for field in _top_level_fields(schema_ddl):
        parts = field.split(None, 1)
        if parts and parts[0].strip("`") == name:
            return parts[1].strip().upper() if len(parts) > 1 else None
    return None


def _top_level_fields(schema_ddl: str) -> list[str]:
    fields, depth, current = [], 0, ""
    for char in schema_ddl + ",":
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        if char == "," and depth == 0:
            fields.append(current.strip())
            current = ""
        else:
            current += char
    return fields


def schema_field_names(schema_ddl: str) -> list[str]:
    """Top-level field names of a Spark DDL schema string, without starting Spark.

    >>> schema_field_names("event_id STRING, amount DECIMAL(10, 2), tags ARRAY<STRING>")
    ['event_id', 'amount', 'tags']
    """
    if schema_ddl.count("<") + schema_ddl.count("(") != schema_ddl.count(">") + schema_ddl.count(")"):
        raise ValueError(f"schema: unbalanced brackets in {schema_ddl!r}")
    names = []
    for field in _top_level_fields(schema_ddl):
        if not field:
            raise ValueError(f"schema: empty field in {schema_ddl!r}")
        parts = field.split(None, 1)
        if len(parts) < 2:
            raise ValueError(f"schema: {field!r} needs a name and a type, e.g. 'amount DOUBLE'")
        name = parts[0].strip("`")
        if not IDENTIFIER.match(name):
            raise ValueError(f"schema: {name!r} is not a valid column name")
        names.append(name)
    return names
