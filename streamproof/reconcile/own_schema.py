"""The pipeline file's record contract, implemented a second time for the independent checker: no Spark, no
``from_json``, none of :mod:`streamproof.transform.records`.

A record is valid when its value is non-empty UTF-8 text holding one JSON object whose declared fields each have
their declared type (missing or null is allowed), whose floating-point fields are finite, and whose ``required``
fields are present and not blank. Anything else is quarantined, with a reason. This is written from the rules in
docs/transforms.md, not from the pipeline's code, so a bug in one shows as a disagreement between the two checkers.

Example::

    >>> schema = RecordSchema.parse("event_id STRING, amount DOUBLE, event_time TIMESTAMP", required=["event_id"])
    >>> schema.read(b'{"event_id": "e1", "amount": 1.5, "event_time": "2026-01-01T00:00:00Z"}')[1] is None
    True
    >>> schema.read(b'{"event_id": "e1", "amount": "twelve"}')[1]
    'schema'
    >>> schema.read(b'{"amount": 2}')[1]
    'missing_required:event_id'
"""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from streamproof.transform.avro import AvroContract

# A window's summed column must stay below this magnitude, so that its exact sum cannot overflow
# DECIMAL(38, 10) (docs/transforms.md).
MAX_SUMMED_MAGNITUDE = 1e18
_INTEGER_RANGES = {
    "TINYINT": 8,
    "BYTE": 8,
    "SMALLINT": 16,
    "SHORT": 16,
    "INT": 32,
    "INTEGER": 32,
    "BIGINT": 64,
    "LONG": 64,
}
_FLOATS = {"DOUBLE", "FLOAT", "REAL"}
_TEXT = {"STRING", "VARCHAR", "CHAR"}
_TIMES = {"TIMESTAMP", "TIMESTAMP_LTZ", "TIMESTAMP_NTZ"}


class Misfit(ValueError):
    """A JSON value that its declared type cannot hold."""


def _split_fields(ddl: str) -> list[tuple[str, str]]:
    """``"a STRING, b DECIMAL(10, 2)"`` -> ``[("a", "STRING"), ("b", "DECIMAL(10,2)")]`` (commas in brackets kept)."""
    fields, depth, current = [], 0, ""
    for char in ddl + ",":
        if char == "," and depth == 0:
            if current.strip():
                name, _, kind = current.strip().partition(" ")
                fields.append((name.strip("`"), re.sub(r"\s+", "", kind).upper()))
            current = ""
            continue
        depth += {"(": 1, ")": -1}.get(char, 0)
        current += char
    return fields


def _typed(value: Any, kind: str) -> Any:
    """The JSON ``value`` as ``kind`` holds it, or :class:`Misfit` (numbers arrive as int or Decimal)."""
    base = kind.split("(")[0]
    if base in _TEXT:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value) if isinstance(value, int | Decimal) else json.dumps(value, default=str)
    if isinstance(value, bool):
        if base == "BOOLEAN":
            return value
        raise Misfit(kind)
    if base in _INTEGER_RANGES:
        bits = _INTEGER_RANGES[base]
        if isinstance(value, int) and -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            return value
        raise Misfit(kind)
    if base in _FLOATS:
        if isinstance(value, int | Decimal | float):
            return float(value)
        raise Misfit(kind)
    if base == "DECIMAL":
        if isinstance(value, int | Decimal):
            return Decimal(value)
        raise Misfit(kind)
    if base in _TIMES:
        return _timestamp(value)
    if base == "DATE":
        if isinstance(value, date) and not isinstance(value, datetime):
            return value
        if isinstance(value, str):
            try:
                return date.fromisoformat(value.strip())
            except ValueError:
                raise Misfit(kind) from None
        raise Misfit(kind)
    raise Misfit(f"unsupported type {kind}")


def _timestamp(value: Any) -> datetime:
    """ISO-8601 text (``T`` or a space, optional fraction and offset; none means UTC), epoch seconds, or a time a
    table holds (a naive one is UTC)."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, int):
        return datetime.fromtimestamp(value, tz=UTC)
    if not isinstance(value, str):
        raise Misfit("TIMESTAMP")
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise Misfit("TIMESTAMP") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _constant(name: str) -> float:
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


@dataclass(frozen=True)
class RecordSchema:
    """Declared fields (name, type), required fields, and the fields a window sums."""

    fields: tuple[tuple[str, str], ...]
    required: tuple[str, ...] = ()
    summed: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, ddl: str, required: list[str] | None = None, summed: list[str] | None = None) -> RecordSchema:
        return cls(tuple(_split_fields(ddl)), tuple(required or ()), frozenset(summed or ()))

    def read(self, value: bytes | None) -> tuple[dict[str, Any], str | None]:
        """The declared fields of a record's value, and why it is invalid (None when it is valid)."""
        if not value:
            return {}, "empty"
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            return {}, "not_utf8"
        try:
            document = json.loads(text, parse_float=Decimal, parse_constant=_constant)
        except (ValueError, InvalidOperation):
            return {}, "invalid_json"
        if not isinstance(document, dict):
            return {}, "invalid_json"
        return self.check(document)

    def check(self, document: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The declared fields of a decoded record (JSON's values, or a table row's), and why it is invalid.

        >>> RecordSchema.parse("order_id STRING", required=["order_id"]).check({"order_id": None})[1]
        'missing_required:order_id'
        """
        values: dict[str, Any] = {}
        reason = None
        for name, kind in self.fields:
            raw = document.get(name)
            try:
                values[name] = None if raw is None else _typed(raw, kind)
            except Misfit:
                values[name], reason = None, reason or "schema"
        if reason:
            return values, reason
        for name, kind in self.fields:
            number = values[name]
            if kind.split("(")[0] in _FLOATS and number is not None and not math.isfinite(number):
                return values, f"out_of_range:{name}"
            if name in self.summed and number is not None and abs(float(number)) >= MAX_SUMMED_MAGNITUDE:
                return values, f"out_of_range:{name}"
        for name in self.required:
            if values.get(name) is None or str(values[name]).strip() == "":
                return values, f"missing_required:{name}"
        return values, None


class AvroReader:
    """Avro records read a second time, by fastavro instead of Spark's ``from_avro``: the header Confluent's wire
    format puts first (when the records come from a registry) must be the contract's, the rest one datum of its
    writer schema; then the declared fields are judged as a JSON record's are (:meth:`RecordSchema.check`).

    >>> contract = AvroContract('{"type": "record", "name": "o", "fields": [{"name": "id", "type": "string"}]}', 5)
    >>> reader = AvroReader(RecordSchema.parse("id STRING", ["id"]), contract)
    >>> reader(contract.frame(b"\\x04ab")), reader(b"\\x04ab")[1], reader(contract.frame(b"\\x04a"))[1]
    (({'id': 'ab'}, None), 'avro', 'avro')
    """

    def __init__(self, schema: RecordSchema, contract: AvroContract) -> None:
        import fastavro  # only for Avro records

        self.schema, self.header = schema, contract.header()
        self.writer = fastavro.parse_schema(json.loads(contract.schema_json))
        self.decode = fastavro.schemaless_reader

    def __call__(self, value: bytes | None) -> tuple[dict[str, Any], str | None]:
        if not value:
            return {}, "empty"
        if not value.startswith(self.header):
            return {}, "avro"
        try:
            datum = self.decode(io.BytesIO(value[len(self.header) :]), self.writer, None)
        except Exception:  # noqa: BLE001 - whatever stops fastavro, the record is not a datum of the schema
            return {}, "avro"
        if not isinstance(datum, dict):
            return {}, "avro"
        return self.schema.check(datum)
