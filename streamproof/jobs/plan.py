"""What a query's plan says about comparing its rows: the columns that differ from run to run, the conditions that
make a verdict impossible, and the operators whose rows depend on how the stream was cut into batches.

A job's rows carry no source coordinates, so a proof compares them whole against a crash-free twin's. A column built
from the clock (``current_timestamp()``), from chance (``rand()``, ``uuid()``) or from a UDF declared
nondeterministic has another value in every run, so it is named and left out (:attr:`PlanFacts.left_out`); such an
expression in a filter, a join condition, a grouping or a dedup key decides *which* rows exist, so no comparison can
say ok (:attr:`PlanFacts.unknown`). Aggregates, dedup, stream-stream joins, state and limits make rows depend on the
batch cuts (:attr:`PlanFacts.stateful`): the twin runs with the same cuts; a recomputation as one batch would not.

The plan is Spark's analysed logical plan as JSON (``df._jdf.queryExecution().analyzed().toJSON()``): its nodes in
pre-order, each with ``num-children``; expressions are lists of the same shape. Read here in plain Python.

Example::

    >>> facts = plan_facts(json.dumps(EXAMPLE_PLAN))
    >>> facts.left_out, facts.unknown, facts.stateful
    ({'ingested_at': 'current_timestamp()'}, [], [])
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

Node = dict[str, Any]

# Expressions whose value is not a function of the row (Spark's non-deterministic ones, and the clock, which Spark
# calls deterministic within one query but which differs between a run and its replay).
VARYING = {
    "CurrentTimestamp": "current_timestamp()",
    "Now": "now()",
    "CurrentDate": "current_date()",
    "LocalTimestamp": "localtimestamp()",
    "CurrentTime": "current_time()",
    "CurrentBatchTimestamp": "the batch's timestamp",
    "Rand": "rand()",
    "Randn": "randn()",
    "Uuid": "uuid()",
    "Shuffle": "shuffle()",
    "MonotonicallyIncreasingID": "monotonically_increasing_id()",
    "SparkPartitionID": "spark_partition_id()",
    "InputFileName": "input_file_name()",
    "InputFileBlockStart": "input_file_block_start()",
    "InputFileBlockLength": "input_file_block_length()",
    "RandStr": "randstr()",
    "Uniform": "uniform()",
}
STATEFUL = {
    "Aggregate": "an aggregation",
    "Deduplicate": "dropDuplicates",
    "DeduplicateWithinWatermark": "dropDuplicatesWithinWatermark",
    "FlatMapGroupsWithState": "a [flat]mapGroupsWithState",
    "FlatMapGroupsInPandasWithState": "applyInPandasWithState",
    "TransformWithState": "transformWithState",
    "TransformWithStateInPySpark": "transformWithStateInPandas",
    "GlobalLimit": "a limit",
    "Window": "a window function",
}
DECIDING_FIELDS = {"condition": "a filter or join condition", "groupingExpressions": "a grouping key", "keys": "a key"}


@dataclass
class PlanFacts:
    """What :func:`plan_facts` found (see the module)."""

    columns: list[str] = field(default_factory=list)  # the query's output columns, in order
    left_out: dict[str, str] = field(default_factory=dict)  # column -> the expression it comes from
    unknown: list[str] = field(default_factory=list)
    stateful: list[str] = field(default_factory=list)


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _tree(nodes: list[Node], start: int = 0) -> tuple[Node, int]:
    """The node at ``start`` with its children attached (``_children``), and the index after its subtree."""
    node = dict(nodes[start])
    following = start + 1
    children = []
    for _ in range(int(node.get("num-children", 0))):
        child, following = _tree(nodes, following)
        children.append(child)
    node["_children"] = children
    return node, following


def _is_expression(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "class" in value[0]


def _expressions(node: Node) -> dict[str, list[list[Node]]]:
    """The node's expression fields, each as a list of flattened expressions."""
    found: dict[str, list[list[Node]]] = {}
    for key, value in node.items():
        if key.startswith("_") or key == "output":
            continue
        if _is_expression(value):
            found[key] = [value]
        elif isinstance(value, list) and value and all(_is_expression(item) for item in value):
            found[key] = value
    return found


def _exprid(element: Node) -> int | None:
    ident = element.get("exprId")
    return int(ident["id"]) if isinstance(ident, dict) and "id" in ident else None


def _varying(expression: list[Node], tainted: dict[int, str]) -> str | None:
    """What makes the flattened expression differ from run to run, if anything."""
    for element in expression:
        name = _short(element.get("class", ""))
        if name in VARYING:
            return VARYING[name]
        if name in ("PythonUDF", "ScalaUDF", "PythonUDAF") and element.get("udfDeterministic") is False:
            return f"the UDF {element.get('name') or element.get('udfName') or '?'} (declared nondeterministic)"
        if name == "AttributeReference" and _exprid(element) in tainted:
            return tainted[_exprid(element)]  # type: ignore[index]
    return None


def _outputs(node: Node, children: list[list[tuple[str, int | None]]]) -> list[tuple[str, int | None]]:
    for key in ("projectList", "aggregateExpressions"):
        listed = node.get(key)
        if isinstance(listed, list) and listed and all(_is_expression(item) for item in listed):
            return [(item[0].get("name", "?"), _exprid(item[0])) for item in listed]
    output = node.get("output")
    if isinstance(output, list) and output and all(_is_expression(item) for item in output):
        return [(item[0].get("name", "?"), _exprid(item[0])) for item in output]
    if _short(node.get("class", "")) == "Join" and len(children) == 2:
        return children[0] + children[1]
    return children[0] if children else []


def _streaming(node: Node) -> bool:
    if "Streaming" in _short(node.get("class", "")):
        return True
    return any(_streaming(child) for child in node["_children"])


def _walk(node: Node, facts: PlanFacts, tainted: dict[int, str]) -> list[tuple[str, int | None]]:
    children = [_walk(child, facts, tainted) for child in node["_children"]]
    kind = _short(node.get("class", ""))
    for key, expressions in _expressions(node).items():
        for expression in expressions:
            reason = _varying(expression, tainted)
            if reason is None:
                continue
            ident = _exprid(expression[0])
            if _short(expression[0].get("class", "")) == "Alias" and ident is not None:
                tainted[ident] = reason
            if key in DECIDING_FIELDS and kind != "Project":
                line = f"{reason} in {DECIDING_FIELDS[key]} ({kind}): it decides which rows exist"
                if line not in facts.unknown:
                    facts.unknown.append(line)
    stateful = STATEFUL.get(kind)
    if kind == "Join" and len(node["_children"]) == 2 and all(_streaming(child) for child in node["_children"]):
        stateful = "a stream-stream join"
    if stateful and _streaming(node) and stateful not in facts.stateful:
        facts.stateful.append(stateful)
    return _outputs(node, children)


def plan_facts(plan_json: str) -> PlanFacts:
    """The facts of one analysed plan (see the module); an empty plan gives none."""
    nodes = json.loads(plan_json)
    facts = PlanFacts()
    if not nodes:
        return facts
    root, _ = _tree(nodes)
    tainted: dict[int, str] = {}
    outputs = _walk(root, facts, tainted)
    facts.columns = [name for name, _ in outputs]
    facts.left_out = {name: tainted[ident] for name, ident in outputs if ident is not None and ident in tainted}
    return facts


def _attribute(name: str, ident: int) -> list[Node]:
    return [{"class": "o.a.s.AttributeReference", "num-children": 0, "name": name, "exprId": {"id": ident}}]


# A stream of orders with an ingestion time: Project(order_id, ingested_at = current_timestamp()) over a stream.
EXAMPLE_PLAN = [
    {
        "class": "o.a.s.Project",
        "num-children": 1,
        "projectList": [
            _attribute("order_id", 1),
            [
                {"class": "o.a.s.Alias", "num-children": 1, "child": 0, "name": "ingested_at", "exprId": {"id": 2}},
                {"class": "o.a.s.CurrentTimestamp", "num-children": 0},
            ],
        ],
    },
    {"class": "o.a.s.StreamingRelationV2", "num-children": 0, "output": [_attribute("order_id", 1)]},
]
