"""Rows compared as multisets: what a crashed run's sink holds against what the crash-free twin's holds.

The job's rows carry no source coordinates, so a row is known by its values: each side is a multiset of canonical
rows (the columns in name order, each value as JSON), and the terms are exact counts from the data:

* ``lost``: rows the twin holds more often than the run (each missing copy counts once);
* ``duplicated``: rows the run holds more often than the twin (each extra copy);
* ``unexpected``: rows of the run the twin never holds;

with up to :data:`SAMPLES` rows of each. Columns that differ from run to run are left out before counting: those the
query's plan builds from the clock or from chance (:mod:`streamproof.jobs.plan`), and those found to differ here
(:func:`varying_columns`: a column whose values the two sides almost never share, while the rest of the row pairs
up). Pure Python: the Spark checker and the independent one (no Spark) both count with it, each from its own reading.

Example::

    >>> twin = [{"order_id": "a", "at": 1}, {"order_id": "b", "at": 2}]
    >>> run = [{"order_id": "a", "at": 7}, {"order_id": "a", "at": 8}, {"order_id": "b", "at": 9}]
    >>> found = compare_rows(twin, run, left_out={"at": "current_timestamp()"})
    >>> found.lost, found.duplicated, found.unexpected, found.samples["duplicated"]
    (0, 1, 0, [{'order_id': 'a'}])
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SAMPLES = 20
SHARED_BELOW = 0.5  # a column whose values the two sides share less than this, over distinct values, varies by run


def canonical(row: Mapping[str, Any], columns: Iterable[str]) -> str:
    """One row as text: the given columns in name order, values as JSON (``str`` for what JSON lacks).

    >>> canonical({"b": 1.5, "a": None, "c": "x"}, ["a", "b"])
    '{"a": null, "b": 1.5}'
    """
    return json.dumps({name: row.get(name) for name in sorted(columns)}, default=str, sort_keys=True)


@dataclass
class RowCounts:
    """The terms of one comparison (see the module), with what was left out and why."""

    twin_rows: int = 0
    rows: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)  # column -> why

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected)

    def terms(self) -> tuple[int, int, int]:
        return self.lost, self.duplicated, self.unexpected


def _multiset(rows: list[Mapping[str, Any]], columns: list[str]) -> Counter[str]:
    return Counter(canonical(row, columns) for row in rows)


def counted(twin: Counter[str], run: Counter[str]) -> RowCounts:
    """The terms of two multisets of canonical rows."""
    found = RowCounts(twin_rows=sum(twin.values()), rows=sum(run.values()))
    samples: dict[str, list[dict[str, Any]]] = {"lost": [], "duplicated": [], "unexpected": []}
    for row, expected in sorted(twin.items()):
        held = run.get(row, 0)
        if held < expected:
            found.lost += expected - held
            samples["lost"].append(json.loads(row))
        elif held > expected:
            found.duplicated += held - expected
            samples["duplicated"].append(json.loads(row))
    for row, held in sorted(run.items()):
        if row not in twin:
            found.unexpected += held
            samples["unexpected"].append(json.loads(row))
    found.samples = {term: rows[:SAMPLES] for term, rows in samples.items() if rows}
    return found


def _values(rows: list[Mapping[str, Any]], column: str) -> set[str]:
    return {json.dumps(row.get(column), default=str) for row in rows}


def varying_columns(twin: list[Mapping[str, Any]], run: list[Mapping[str, Any]], columns: list[str]) -> list[str]:
    """The columns that differ from run to run, found in the data: the two sides share few of the column's values
    (less than :data:`SHARED_BELOW` of the twin's distinct ones), and rows that pair up on every other column hold
    other values of it (in at least half of the pairs). A run that lost rows shares fewer values too, but the rows it
    kept pair up with the same values: a loss is never taken for a varying column.

    >>> twin = [{"id": i, "amount": i * 10, "uuid": f"t{i}"} for i in range(10)]
    >>> varying_columns(twin, [{**row, "uuid": "r" + row["uuid"]} for row in twin], ["amount", "id", "uuid"])
    ['uuid']
    >>> varying_columns(twin, twin[:3], ["amount", "id", "uuid"])   # 7 of 10 lost: no column varies
    []
    """
    if not twin or not run:
        return []
    candidates = []
    for column in columns:
        values = _values(twin, column)
        if len(values) > 1 and len(values & _values(run, column)) / len(values) < SHARED_BELOW:
            candidates.append(column)
    others = [name for name in columns if name not in candidates]
    if not candidates or not others:
        return []
    twin_by: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    run_by: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in twin:
        twin_by[canonical(row, others)].append(row)
    for row in run:
        run_by[canonical(row, others)].append(row)
    paired = [key for key in twin_by if key in run_by]
    if not paired:
        return []
    found = []
    for column in candidates:
        differing = sum(1 for key in paired if _values(twin_by[key], column).isdisjoint(_values(run_by[key], column)))
        if differing / len(paired) >= 0.5:
            found.append(column)
    return found


def compare_rows(
    twin: list[Mapping[str, Any]], run: list[Mapping[str, Any]], left_out: Mapping[str, str] | None = None
) -> RowCounts:
    """The terms of a run's rows against the twin's (see the module): the plan's varying columns left out first, then
    those found to vary in the data."""
    names = sorted({name for row in [*twin[:1], *run[:1]] for name in row})
    left = {name: why for name, why in (left_out or {}).items() if name in names}
    columns = [name for name in names if name not in left]
    for column in varying_columns(twin, run, columns):
        left[column] = "differs between the twin and the runs (found in the data)"
    columns = [name for name in columns if name not in left]
    found = counted(_multiset(twin, columns), _multiset(run, columns))
    found.left_out = left
    return found
