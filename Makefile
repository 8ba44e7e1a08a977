# The front door: `make run` and `make test` (see README Quickstart).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TOOLS  := .tools
STAMP  := $(VENV)/.installed

.PHONY: run test venv install-test system-deps kafka-jars lint typecheck unit bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[fast]'
	touch $@

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/tsproxy serve $(ARGS)

$(VENV)/.installed-test: $(STAMP) pyproject.toml
	$(PIP) install -q -e '.[fast,spark,test]'
	touch $@

# The aws cli pins its own botocore; it lives in a venv of its own so it never fights aiobotocore.
$(TOOLS)/awscli/bin/aws:
	$(PYTHON) -m venv $(TOOLS)/awscli
	$(TOOLS)/awscli/bin/pip install -q awscli

# System packages the tests use: a real Prometheus (and promtool), Java for Spark.
system-deps:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null || ! command -v java >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus default-jre-headless >/dev/null; \
	  $$SUDO systemctl stop prometheus 2>/dev/null || $$SUDO service prometheus stop 2>/dev/null || true; \
	fi

# A Kafka broker and Aiven's tiered storage plugin for tests/broker, and a Kafka Connect worker with
# Aiven's S3 sink for tests/connect, resolved by Maven from the POMs in deploy/kafka/maven into cache
# folders outside the repository (reused while the POMs stay the same).
kafka-jars:
	sh deploy/kafka/jars.sh
	sh deploy/kafka/connect-jars.sh

install-test: $(VENV)/.installed-test $(TOOLS)/awscli/bin/aws system-deps kafka-jars

lint: install-test
	$(VENV)/bin/ruff check tsproxy tests benchmarks deploy
	$(VENV)/bin/ruff format --check tsproxy tests benchmarks deploy

typecheck: install-test
	$(VENV)/bin/mypy

test: install-test lint typecheck
	PATH="$(CURDIR)/$(TOOLS)/awscli/bin:$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q -ra $(PYTEST_ARGS)

unit: install-test
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

# Each benchmark prints a table; add --json PATH to keep the figures. The broker's path runs in five
# rounds per client (README: one run's ratios move by a tenth or more on a small machine).
bench: install-test
	$(PY) benchmarks/transform.py
	$(PY) benchmarks/frames.py
	$(PY) benchmarks/proxy.py
	$(PY) benchmarks/fetch.py --systems tsproxy,direct --rounds 5
	$(PY) benchmarks/fetch.py --systems tsproxy,direct --rounds 5 --client boto3
	$(PY) benchmarks/fetch.py --systems tsproxy,direct --rounds 3 --producer-codec zstd
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/fetch.py
	$(PY) benchmarks/cpu.py
	$(PY) benchmarks/cpu.py --client-checks none --producer-codec zstd
	$(PY) benchmarks/listing.py
	$(PY) benchmarks/http_floor.py
	$(PY) benchmarks/spark_export.py
	$(PY) benchmarks/jobs.py

clean:
	rm -rf $(VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache tsproxy-data
