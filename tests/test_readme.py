"""README.md's "From Python" example, run as written (the broker's address replaced by the test broker's), in a
fresh folder: it generates its own records, proves the pipeline through a SIGKILL after the sink's commit (the
crash must land: the harness fails a missed one), runs it in this process on later records, and verifies.
The example once drained the topic with run() before prove(), which then found nothing to crash in. That run is in
the slow tier (`make test-all`); CI checks, without a JVM, that the example calls streamproof as it is (its
imports, a valid Pipeline, the calls' keyword arguments)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import REPO
from streamproof.infra import KafkaBroker

pytestmark = [pytest.mark.integration, pytest.mark.crash]


def readme_example(section: str) -> str:
    """The first Python code block of a README section."""
    text = (REPO / "README.md").read_text()
    body = text[text.index(f"## {section}\n"):]
    match = re.search(r"```python\n(.*?)```", body, re.DOTALL)
    assert match is not None, f"README's {section} has no Python block"
    return match.group(1)


def test_the_from_python_example_calls_streamproof_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's code, run with its four calls recorded instead of made: its imports resolve, its Pipeline is
    valid, and each call's arguments bind to the function's signature (a renamed keyword fails here)."""
    import inspect

    import streamproof
    import streamproof.generator

    calls: list[str] = []

    def recorded(function: Any, answer: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            inspect.signature(function).bind(*args, **kwargs)
            calls.append(function.__name__)
            return answer

        return call

    passed = SimpleNamespace(ok=True)
    passed.reports = [passed]
    for name, answer in (("prove", passed), ("run", None), ("verify", [passed])):
        monkeypatch.setattr(streamproof, name, recorded(getattr(streamproof, name), answer))
    monkeypatch.setattr(streamproof.generator, "generate", recorded(streamproof.generator.generate, None))
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(compile(readme_example("From Python"), "README.md", "exec"), scope)  # noqa: S102
    assert calls == ["generate", "prove", "generate", "run", "verify"]
    assert isinstance(scope["pipeline"], streamproof.Pipeline)


def test_the_from_python_example_runs_as_written(
    kafka_broker: KafkaBroker, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = readme_example("From Python")
    assert code.count("127.0.0.1:9092") == 3
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(compile(code.replace("127.0.0.1:9092", kafka_broker.bootstrap_servers), "README.md", "exec"), scope)  # noqa: S102
    proof, summary = scope["proof"], scope["summary"]
    assert [crash.point for crash in proof.crashes] == ["after-sink-commit"]
    assert proof.reports[0].source_records == 12_000 and proof.reports[0].ok
    assert summary.rows_in == 5_000
    assert (tmp_path / "tables" / "orders" / "_delta_log").is_dir()
