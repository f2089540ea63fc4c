# The two commands of the README, and what they stand on. Every step is idempotent and cached:
# the virtualenv is rebuilt only when pyproject.toml changes, the jars only when a pom changes.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed-$(shell cat pyproject.toml setup.py | sha1sum | cut -c1-12)
BYTECODE := $(subst installed,bytecode,$(INSTALLED))

.PHONY: demo test test-all setup system-packages jars jvm-archive lint clean kafka-delta-ingest

demo: setup
	@$(PY) -m compileall -q streamproof
	$(VENV)/bin/streamproof demo

# pytest exits 5 when it collects no test: make stops on any non-zero code, so that fails too.
test: setup
	@$(PY) -m compileall -q streamproof tests
	$(PY) -m pytest

# The whole suite, the slow tier too (tests/conftest.py SLOW_TIER: tests a faster CI test proves again).
test-all: setup
	@$(PY) -m compileall -q streamproof tests
	$(PY) -m pytest --slow

setup: system-packages $(INSTALLED) $(BYTECODE) jars jvm-archive

system-packages:
	@scripts/ensure-system-packages.sh

# uv installs what pip would (the same versions, checked with `pip freeze`), with its downloads in parallel: on an empty
# cache 35.6 s (+2.3 s for uv itself) against pip's 77.5 s, measured here. pip stays the way in if uv cannot run.
# pyspark is published as a source archive only, and the package index here answers every revalidation as modified:
# uv downloaded and built it again on each install (15.5 s) and kept each build, 1.4 GB of its cache a clean clone
# (51 GB after 57 installs, until the suite had no disk left). Its wheel is built once into streamproof's cache and
# installed from there (1.0 s); `uv cache prune` then drops what earlier installs left unreferenced.
WHEELS := $(or $(STREAMPROOF_CACHE),$(HOME)/.cache/streamproof)/wheels
PYSPARK_PIN := $(shell grep -o 'pyspark==[0-9.]*' pyproject.toml)
PYSPARK_WHEEL := $(WHEELS)/$(subst ==,-,$(PYSPARK_PIN))-py2.py3-none-any.whl

$(INSTALLED): pyproject.toml setup.py
	@test -x $(PY) || $$(scripts/python311.sh) -m venv $(VENV)
	@scripts/pyspark-wheel.sh $(PY) $(PYSPARK_PIN) $(PYSPARK_WHEEL)
	$(PY) -m pip install -q uv && $(VENV)/bin/uv pip install -q --python $(PY) --find-links $(WHEELS) \
		$(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS)) -e '.[dev]' \
		|| $(PY) -m pip install -q --find-links $(WHEELS) -e '.[dev]'
	@$(VENV)/bin/uv cache prune -q 2>/dev/null || true
	@rm -f $(VENV)/.installed-* && touch $@

# Every Python process of a run imports pyspark, pydantic, typer and the rest. Where bytecode is not written
# (PYTHONDONTWRITEBYTECODE=1, as in this machine's environment) each one compiled them again from source: measured, one
# pipeline run's Python process 3.44 -> 1.30 core-s, `import streamproof.cli, pyspark.sql, delta` 1.0 -> 0.4 s.
$(BYTECODE): $(INSTALLED)
	@$(PY) -m compileall -q -j0 $(VENV)/lib > /dev/null
	@rm -f $(VENV)/.bytecode-* && touch $@

jars: $(INSTALLED)
	@$(PY) -m streamproof.jvm.jars

# Class-data archive of a trained Spark JVM (once, ~1 min): each later JVM start is ~4 s faster.
jvm-archive: jars
	@$(PY) -m streamproof.jvm.archive

# bench throughput's kafka-delta-ingest side, built once from its source (18-22 minutes of 2 cores; not part of setup).
kafka-delta-ingest:
	@scripts/build-kafka-delta-ingest.sh

lint: setup
	$(VENV)/bin/ruff check streamproof tests
	$(VENV)/bin/ruff format --check streamproof
	$(VENV)/bin/mypy streamproof

clean:
	rm -rf $(VENV) .streamproof .pytest_cache .mypy_cache .ruff_cache
