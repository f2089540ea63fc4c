"""The shop's own test of its pipeline: shop_orders.toml (shop/orders.py's enrich: a customers lookup, a Python
UDF, line items) proven exactly-once by streamproof's pytest plugin: real SIGKILLs of the pipeline after its sinks
committed a batch, restarts, and a reconciliation of each sink against what enrich makes of the source records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shop.customers import write_customers

from streamproof.config import PostgresSinkSpec, load_pipeline

PIPELINE = Path(__file__).resolve().parent.parent / "shop_orders.toml"


def test_shop_orders_are_exactly_once_through_crashes(
    streamproof_prover: Any, streamproof_spark: Any, streamproof_postgres: Any, tmp_path: Path
) -> None:
    write_customers(streamproof_spark, str(tmp_path / "customers"))
    spec = load_pipeline(PIPELINE)
    here = spec.model_copy(update={  # the test's customers table and PostgreSQL server
        "lookups": [spec.lookups[0].model_copy(update={"path": str(tmp_path / "customers")})],
        "sinks": [sink.model_copy(update={"port": streamproof_postgres.port})
                  if isinstance(sink, PostgresSinkSpec) else sink for sink in spec.sinks],
    })  # fmt: skip
    report = streamproof_prover.prove(here, events=3_000, batch_size=1_000, crash_at=["after-sink-commit"])
    assert report.your_code and report.unit == "keys"
    assert (report.lost, report.duplicated, report.unexpected) == (0, 0, 0)
    assert report.transformed + report.quarantined == 3_000
