"""Avro records: the writer schema a pipeline reads them with, from a schema file or from a schema registry.

``[transform] format = "avro"`` takes either ``avro_schema`` (an ``.avsc`` file: each record is the Avro binary
encoding of one datum, nothing before it) or ``schema_registry`` (the URL of a Confluent-compatible registry: each
record is in Confluent's wire format, a zero magic byte, the schema's id as 4 big-endian bytes, then the datum).
The registry is asked once per start for the latest version of the subject (``schema_subject``, by default
``<topic>-value``, Confluent's topic naming); a record written with another schema id is quarantined with reason
``avro``, like one that does not decode, and a restart reads the subject's new latest version.

Example::

    >>> contract = AvroContract('{"type": "record", "name": "o", "fields": [{"name": "id", "type": "string"}]}')
    >>> contract.frame(b"\\x04ab"), contract.field_names()
    (b'\\x04ab', ['id'])
    >>> AvroContract(contract.schema_json, schema_id=7).frame(b"\\x04ab")
    b'\\x00\\x00\\x00\\x00\\x07\\x04ab'
"""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from streamproof.config import KafkaSource, PipelineSpec
from streamproof.errors import ConfigError

MAGIC_BYTE = 0
REGISTRY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class AvroContract:
    """The writer schema of a pipeline's Avro records (JSON text), and the registry id its records carry (None: a
    schema file, records without a header)."""

    schema_json: str
    schema_id: int | None = None

    def field_names(self) -> list[str]:
        """The top-level fields of the record schema."""
        return [field["name"] for field in json.loads(self.schema_json).get("fields", [])]

    def frame(self, datum: bytes) -> bytes:
        """A record's bytes as the pipeline expects them: the datum, after Confluent's header when from a registry."""
        if self.schema_id is None:
            return datum
        return struct.pack(">bI", MAGIC_BYTE, self.schema_id) + datum

    def header(self) -> bytes:
        """The header every record of this contract starts with (empty for a schema file)."""
        return self.frame(b"")


def avro_contract(spec: PipelineSpec) -> AvroContract | None:
    """The writer schema of ``spec``'s records, read from its file or asked of its registry; None for JSON records.

    >>> avro_contract(load_pipeline("examples/orders_avro_to_delta.toml")).schema_id is None   # doctest: +SKIP
    True
    """
    transform = spec.transform
    if transform.format != "avro":
        return None
    if transform.avro_schema is not None:
        location = spec.resolve_path(transform.avro_schema)
        try:
            text = location.read_text()
        except OSError as error:
            raise ConfigError(f"transform.avro_schema: cannot read {location}: {error.strerror or error}") from None
        return AvroContract(checked_schema(text, f"transform.avro_schema: {location}"))
    assert transform.schema_registry is not None, "the config requires avro_schema or schema_registry"
    return latest_schema(transform.schema_registry, subject_of(spec))


def with_subject_pinned(spec: PipelineSpec) -> PipelineSpec:
    """``spec`` reading the registry subject it reads now even on another topic (the prover's and the matrix's
    fresh topics): ``schema_subject`` set to :func:`subject_of`. Unchanged without a registry.

    >>> with_subject_pinned(spec).transform.schema_subject                            # doctest: +SKIP
    'orders-value'
    """
    if spec.transform.schema_registry is None or spec.transform.schema_subject:
        return spec
    return spec.model_copy(update={"transform": spec.transform.model_copy(update={"schema_subject": subject_of(spec)})})


def subject_of(spec: PipelineSpec) -> str:
    """The registry subject of the pipeline's records: ``schema_subject``, or ``<topic>-value``."""
    if spec.transform.schema_subject:
        return spec.transform.schema_subject
    if not isinstance(spec.source, KafkaSource):
        raise ConfigError("transform.schema_subject: required when the source is not a Kafka topic")
    return f"{spec.source.topic}-value"


def latest_schema(registry: str, subject: str) -> AvroContract:
    """The latest version of ``subject`` in a Confluent-compatible registry (``GET /subjects/<subject>/versions/
    latest``), as a contract whose records carry its id.

    >>> latest_schema("http://127.0.0.1:8081", "orders-value").schema_id    # doctest: +SKIP
    3
    """
    url = f"{registry.rstrip('/')}/subjects/{urllib.parse.quote(subject, safe='')}/versions/latest"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.schemaregistry.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=REGISTRY_TIMEOUT_S) as answer:
            body: dict[str, Any] = json.loads(answer.read())
    except urllib.error.HTTPError as error:
        found = "no such subject" if error.code == 404 else f"HTTP {error.code}"
        raise ConfigError(f"transform.schema_registry: {url}: {found}; register the schema of {subject!r}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ConfigError(f"transform.schema_registry: cannot reach {registry}: {reason}") from None
    except ValueError:
        raise ConfigError(f"transform.schema_registry: {url} did not answer with JSON") from None
    if body.get("schemaType", "AVRO") != "AVRO" or "schema" not in body or "id" not in body:
        raise ConfigError(f"transform.schema_registry: {url}: the latest version of {subject!r} is not an Avro schema")
    return AvroContract(checked_schema(body["schema"], f"transform.schema_registry: {subject!r}"), int(body["id"]))


def register_schema(registry: str, subject: str, schema_json: str) -> AvroContract:
    """Register ``schema_json`` under ``subject`` (``POST /subjects/<subject>/versions``; the registry answers with
    the id of the same schema if it has it already), as a contract whose records carry its id.

    >>> register_schema("http://127.0.0.1:8081", "orders-value", ORDER_SCHEMA).schema_id    # doctest: +SKIP
    1
    """
    url = f"{registry.rstrip('/')}/subjects/{urllib.parse.quote(subject, safe='')}/versions"
    payload = json.dumps({"schema": checked_schema(schema_json, "--avro-schema")}).encode()
    request = urllib.request.Request(
        url, data=payload, method="POST", headers={"Content-Type": "application/vnd.schemaregistry.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=REGISTRY_TIMEOUT_S) as answer:
            body: dict[str, Any] = json.loads(answer.read())
    except urllib.error.HTTPError as error:
        raise ConfigError(f"--schema-registry: {url} refused the schema: HTTP {error.code}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as error:
        raise ConfigError(f"--schema-registry: cannot reach {registry}: {getattr(error, 'reason', error)}") from None
    except ValueError:
        raise ConfigError(f"--schema-registry: {url} did not answer with JSON") from None
    if "id" not in body:
        raise ConfigError(f"--schema-registry: {url} answered without a schema id: {body}")
    return AvroContract(schema_json, int(body["id"]))


def checked_schema(text: str, where: str) -> str:
    """``text`` if it is an Avro record schema, else :class:`ConfigError` naming ``where``.

    >>> checked_schema('{"type": "string"}', "transform.avro_schema: o.avsc")
    Traceback (most recent call last):
    ...
    streamproof.errors.ConfigError: transform.avro_schema: o.avsc: not an Avro record schema (its type is 'string')
    """
    try:
        schema = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"{where}: not JSON: {error}") from None
    kind = schema.get("type") if isinstance(schema, dict) else schema
    if kind != "record" or not isinstance(schema.get("fields"), list):
        raise ConfigError(f"{where}: not an Avro record schema (its type is {kind!r})")
    return text
