"""Avro records: the schema registry client against a registry's answers, and an Avro pipeline in Confluent's wire
format SIGKILLed mid-write, reconciled by both checkers.

No schema registry can be installed from the registries this machine reaches (Confluent's is not on Maven Central
or PyPI, Karapace is not on PyPI, Apicurio's is a Quarkus application Maven Central has only as parts), so the
registry here is a small HTTP server in the test that gives the answers of Confluent's REST API: a registration's
id (``POST /subjects/<subject>/versions``), and the latest version of a subject from
``tests/data/schema_registry_latest.json`` (``GET /subjects/<subject>/versions/latest``, in the API's documented
format). The bare-Avro example (a schema file) runs in test_examples.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from streamproof.config import load_pipeline
from streamproof.errors import ConfigError
from streamproof.generator import ORDER_AVRO_SCHEMA, order_events
from streamproof.reconcile.independent import disagreements, verify_independently
from streamproof.reconcile.own_schema import AvroReader, RecordSchema
from streamproof.testing import Prover
from streamproof.transform.avro import AvroContract, latest_schema, register_schema

ANSWER = json.loads((REPO / "tests" / "data" / "schema_registry_latest.json").read_text())
SUBJECT = ANSWER["subject"]


class _Registry(BaseHTTPRequestHandler):
    """Confluent's REST API for one subject: its latest version, and registrations (answered with the same id)."""

    registered: list[dict[str, Any]] = []

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == f"/subjects/{SUBJECT}/versions/latest":
            self._answer(200, ANSWER)
        else:
            self._answer(404, {"error_code": 40401, "message": "Subject not found."})

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Registry.registered.append({"path": self.path, **body})
        self._answer(200, {"id": ANSWER["id"]})

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_registry_client_reads_the_latest_schema_and_registers_one(registry: str) -> None:
    contract = latest_schema(registry, SUBJECT)
    assert contract.schema_id == 1 and json.loads(contract.schema_json) == json.loads(ORDER_AVRO_SCHEMA)
    assert contract.header() == b"\x00\x00\x00\x00\x01"
    assert register_schema(registry, "other-value", ORDER_AVRO_SCHEMA).schema_id == 1
    assert _Registry.registered[-1] == {"path": "/subjects/other-value/versions", "schema": ORDER_AVRO_SCHEMA}
    with pytest.raises(ConfigError, match=r"^transform.schema_registry: .*/subjects/nope-value/versions/latest: no "
                       r"such subject; register the schema of 'nope-value'$"):  # fmt: skip
        latest_schema(registry, "nope-value")
    with pytest.raises(ConfigError, match=r"^transform.schema_registry: cannot reach http://127.0.0.1:9: "):
        latest_schema("http://127.0.0.1:9", SUBJECT)


def test_the_independent_reader_quarantines_every_malformed_avro_kind_as_the_generator_meant() -> None:
    """Each generated kind lands where it is meant to: a cut datum, a wrong header or garbage as ``avro``."""
    contract = AvroContract(ORDER_AVRO_SCHEMA, schema_id=1)
    reader = AvroReader(RecordSchema.parse("event_id STRING, order_id STRING, amount DOUBLE, event_time TIMESTAMP",
                                           ["event_id", "order_id"]), contract)  # fmt: skip
    seen: dict[str | None, set[str | None]] = {}
    for _, _, value, kind in order_events(4_000, seed=3, malformed=0.2, avro=contract):
        seen.setdefault(kind, set()).add(reader(value)[1])
    assert seen[None] == {None}
    assert seen["broken_json"] == seen["wrong_type"] == seen["binary_garbage"] == {"avro"}
    assert seen["missing_required"] == {"missing_required:event_id", "missing_required:order_id"}
    assert seen["empty_value"] == {"empty", "missing_required:event_id"}
    assert reader(b"\x00\x00\x00\x00\x02" + contract.frame(b"")[5:])[1] == "avro"  # another schema id


@pytest.mark.integration
@pytest.mark.crash
def test_an_avro_pipeline_from_a_registry_survives_a_kill_mid_write(
    registry: str, streamproof_prover: Prover, tmp_path: Path
) -> None:
    """Confluent's wire format, the schema asked of the registry at each start: 0 lost / 0 duplicated through a
    SIGKILL in the middle of the Delta write, malformed records quarantined as ``avro``; both checkers agree."""
    text = (REPO / "examples" / "orders_avro_to_delta.toml").read_text()
    text = text.replace('avro_schema = "examples/schemas/order.avsc"',
                        f'schema_registry = "{registry}"\nschema_subject = "{SUBJECT}"')  # fmt: skip
    pipeline_file = tmp_path / "avro.toml"
    pipeline_file.write_text(text)
    spec = load_pipeline(pipeline_file)
    report = streamproof_prover.prove(spec, events=3_000, crash_at=("mid-sink-write",), batch_size=1_000)
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0) and report.identity_holds
    assert report.quarantine_reasons.get("avro", 0) > 0, report.to_dict()
    run = load_pipeline(streamproof_prover.workdir / f"proof-{len(streamproof_prover.proofs)}" / "pipeline.toml")
    assert run.transform.schema_subject == SUBJECT
    assert disagreements(streamproof_prover.proofs[-1].reports, verify_independently(run)) == []
