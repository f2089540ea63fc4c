"""The alerts shipped in ops/prometheus, unit-tested by Prometheus's own promtool (firing and not firing), and
checked to have teeth: each alert made blind (its expression never true) fails its test. No server: the
integration test with a real Prometheus is in test_metrics.py."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from streamproof.metrics import PipelineMetrics

OPS = REPO / "ops" / "prometheus"
ALERTS = ("StreamproofPipelineDown", "StreamproofBatchStalled", "StreamproofKafkaLagGrowing",
          "StreamproofQuarantineShareHigh", "StreamproofRestarting")  # fmt: skip


def _promtool(*args: str, cwd: Path = OPS) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing: make setup installs it (Debian package prometheus)"
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_the_alerts_and_the_scrape_config_are_valid_and_their_unit_tests_pass() -> None:
    checked = _promtool("check", "config", "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 5 rules found" in checked.stdout, checked.stdout
    tested = _promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr
    rules = (OPS / "alerts.yml").read_text()
    assert re.findall(r"- alert: (\w+)", rules) == list(ALERTS)
    assert all(f"alertname: {alert}" in (OPS / "alerts_test.yml").read_text() for alert in ALERTS)


@pytest.mark.parametrize("alert", ALERTS)
def test_an_alert_made_blind_fails_its_unit_test(alert: str, tmp_path: Path) -> None:
    rules = (OPS / "alerts.yml").read_text()
    start = rules.index(f"- alert: {alert}")
    expr = re.compile(r"(\n        expr: )(>-\n(?:          .*\n)+|.*\n)")
    match = expr.search(rules, start)
    assert match is not None
    blind = rules[: match.start()] + match.group(1) + "vector(0) > 1\n" + rules[match.end() :]
    (tmp_path / "alerts.yml").write_text(blind)
    shutil.copy(OPS / "alerts_test.yml", tmp_path / "alerts_test.yml")
    tested = _promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert tested.returncode != 0 and alert in tested.stdout + tested.stderr, tested.stdout


def test_every_metric_the_alerts_read_is_one_a_pipeline_exports() -> None:
    metrics = PipelineMetrics("p")
    exported = {sample.name for family in metrics.registry.collect() for sample in family.samples}
    exported |= {family.name for family in metrics.registry.collect()}
    metrics.observe_runs(1)
    metrics.observe_batch({"batchId": 0, "numInputRows": 1}, {"delta": 1}, 0)
    exported |= {sample.name for family in metrics.registry.collect() for sample in family.samples}
    read = set(re.findall(r"streamproof_\w+", (OPS / "alerts.yml").read_text()))
    assert read and read <= exported, read - exported
