# The front door: `make run` and `make test` (see README Quickstart).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TOOLS  := .tools
STAMP  := $(VENV)/.installed
# apt waits for another apt to finish instead of failing on its lock, and a failed install stops make.
APT_OPTS := -o DPkg::Lock::Timeout=600

.PHONY: run test venv install-test system-deps kafka-jars image-deps image toxiproxy lint typecheck unit bench clean

# toxiproxy (a TCP proxy that adds latency, bandwidth limits, resets and stalls) for the network tests
# and benchmarks, built from the Go module proxy at a pinned version into a cache outside the worktree, so
# every checkout shares one build. tests/support/toxiproxy.py looks for it at the same place.
TOXIPROXY_VERSION := v2.12.0
TOOLS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/tsproxy-tools
TOXIPROXY := $(TOOLS_CACHE)/toxiproxy-$(TOXIPROXY_VERSION)/server

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
	  $$SUDO apt-get $(APT_OPTS) update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get $(APT_OPTS) install -y -qq --no-install-recommends prometheus default-jre-headless >/dev/null || exit 1; \
	  $$SUDO systemctl stop prometheus 2>/dev/null || $$SUDO service prometheus stop 2>/dev/null || true; \
	fi

# A Kafka broker and Aiven's tiered storage plugin for tests/broker, and a Kafka Connect worker with
# Aiven's S3 sink for tests/connect, resolved by Maven from the POMs in deploy/kafka/maven into cache
# folders outside the repository (reused while the POMs stay the same).
kafka-jars:
	sh deploy/kafka/jars.sh
	sh deploy/kafka/connect-jars.sh

# buildah and debootstrap: the container images are built (and tested) without a container engine.
image-deps:
	@if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get $(APT_OPTS) update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get $(APT_OPTS) install -y -qq --no-install-recommends buildah debootstrap >/dev/null || exit 1; \
	fi

# Both container images, tsproxy:VERSION (server) and tsproxy-pipeline:VERSION (with the data pipeline
# and Java), with buildah from a Debian base made once and kept in buildah's storage (README, Install).
# With Docker: docker build -t tsproxy:VERSION . (see the Dockerfile).
image: image-deps
	$(PYTHON) deploy/image/build.py all

$(TOXIPROXY):
	@command -v go >/dev/null || { echo "toxiproxy is built with Go (https://go.dev/dl), which is not on PATH" >&2; exit 1; }
	GOBIN=$(dir $@) GOFLAGS=-buildvcs=false go install github.com/Shopify/toxiproxy/v2/cmd/server@$(TOXIPROXY_VERSION)

toxiproxy: $(TOXIPROXY)

install-test: $(VENV)/.installed-test $(TOOLS)/awscli/bin/aws system-deps kafka-jars image-deps toxiproxy

lint: install-test
	$(VENV)/bin/ruff check tsproxy tests benchmarks deploy
	$(VENV)/bin/ruff format --check tsproxy tests benchmarks deploy

typecheck: install-test
	$(VENV)/bin/mypy

test: install-test lint typecheck
	PATH="$(CURDIR)/$(TOOLS)/awscli/bin:$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q -ra --durations=30 $(PYTEST_ARGS)

unit: install-test
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

# Each benchmark prints a table; add --json PATH to keep the figures. The broker's path runs in five
# rounds per client (benchmarks/README.md: one run's ratios move by a tenth or more on a small machine).
bench: install-test
	$(PY) benchmarks/transform.py
	$(PY) benchmarks/frames.py
	$(PY) benchmarks/proxy.py
	$(PY) benchmarks/fetch.py --systems tsproxy,direct --rounds 5
	$(PY) benchmarks/fetch.py --systems tsproxy,direct --rounds 5 --client boto3
	$(PY) benchmarks/fetch.py --systems tsproxy,direct --rounds 3 --producer-codec zstd
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) benchmarks/fetch.py
	$(PY) benchmarks/network.py
	$(PY) benchmarks/cpu.py
	$(PY) benchmarks/cpu.py --client-checks none --producer-codec zstd
	$(PY) benchmarks/listing.py
	$(PY) benchmarks/http_floor.py
	$(PY) benchmarks/spark_export.py
	$(PY) benchmarks/jobs.py

clean:
	rm -rf $(VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache tsproxy-data
