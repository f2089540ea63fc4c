"""``streamproof maintain``'s refusals that the pipeline file decides: made before a table is touched (pure Python:
no Spark session is given, and none is needed to refuse)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from conftest import REPO
from streamproof.config import load_pipeline
from streamproof.errors import ConfigError
from streamproof.maintenance import maintain


def test_a_where_for_a_pipeline_without_a_partitioned_table_is_refused_before_any_table_is_vacuumed() -> None:
    """``--optimize --where P --vacuum H`` on a pipeline none of whose Delta tables is partitioned: the ``--where``
    cannot apply, which the pipeline file says. It used to be refused after VACUUM had deleted files of every table;
    now nothing runs (a session of None would fail at the first table)."""
    spec = load_pipeline(REPO / "examples" / "orders_to_delta.toml")
    with pytest.raises(ConfigError) as refusal:
        list(maintain(cast(Any, None), spec, compact=True, vacuum_hours=200, where="order_bucket = 0"))
    assert str(refusal.value) == (
        "--where: the pipeline has no partitioned Delta table (a sink's partition_by): leave --where out to compact "
        "whole tables"
    )
