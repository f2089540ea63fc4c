"""Installed where the job lives: the wheel built from this checkout, installed into a fresh virtualenv outside it,
``streamproof setup``, then ``streamproof prove`` of the tutorial Delta job, all from a folder that is not the
checkout and with nothing of the checkout on the import path: what a team does that adds streamproof to the
environment its job runs in.

The virtualenv takes its packages from uv's cache (``make setup`` filled it) and the jars from streamproof's
(the same poms: the same key). ``setup --no-archive``: the class-data archive of a new install takes a minute and
only speeds JVM starts up (docs/jobs.md). One crash point: the full proof of the job is tests/test_jobs.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from streamproof.generator import generate
from streamproof.infra import KafkaBroker

UV = Path(os.environ.get("VIRTUAL_ENV", str(REPO / ".venv"))) / "bin" / "uv"


def _python311() -> str:
    found = subprocess.run([str(REPO / "scripts" / "python311.sh")], capture_output=True, text=True, check=True)
    return found.stdout.strip()


@pytest.mark.integration
@pytest.mark.crash
def test_the_wheel_installed_outside_the_checkout_sets_up_and_proves_the_delta_job(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    uv = str(UV) if UV.exists() else shutil.which("uv")
    assert uv, "uv (installed by make setup into .venv) builds the wheel and the virtualenv"
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    build = [uv, "build", "--wheel", "-o", str(tmp_path / "dist"), "-q", str(REPO)]
    built = subprocess.run(build, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("streamproof-*.whl")
    venv = tmp_path / "venv"
    for command in ([uv, "venv", "-q", "--python", _python311(), str(venv)],
                    [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), str(wheel)]):  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
        assert done.returncode == 0, done.stderr
    team = tmp_path / "team"  # the team's folder: its job, nothing of this checkout
    team.mkdir()
    job = team / "orders_bronze.py"
    shutil.copy(REPO / "examples" / "jobs" / "orders_bronze.py", job)
    streamproof = str(venv / "bin" / "streamproof")

    def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [streamproof, *args], capture_output=True, text=True, timeout=timeout, cwd=team, env=environment
        )

    setup = run("setup", "--no-archive", timeout=300)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "java: " in setup.stdout and "jars spark: " in setup.stdout
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import streamproof; print(streamproof.__file__)"],
        capture_output=True, text=True, cwd=team, env=environment,
    )  # fmt: skip
    assert str(venv) in where.stdout, where.stdout  # the installed package, not the checkout's
    generate(kafka_broker.bootstrap_servers, "wheel-orders", 2_000, seed=5)
    report = team / "proof.json"
    proved = run(
        "prove", str(job), "--kafka", kafka_broker.bootstrap_servers, "--map", f"s3://prod/={team / 'prod'}/",
        "--topic", "orders=wheel-orders", "--crash-at", "after-sink-commit", "--json", str(report), timeout=900,
    )  # fmt: skip
    assert proved.returncode == 0, proved.stdout[-3000:] + proved.stderr[-3000:]
    (query,) = json.loads(report.read_text())["queries"]
    assert query["guarantee"] == "exactly-once"
    assert [cell["outcome"] for cell in query["cells"]] == ["clean"]
