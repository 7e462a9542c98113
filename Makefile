# llm-governor: set-up, test, lint, demo. Every target creates its own virtual environment.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: all test lint demo bench prometheus proto venv clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The Prometheus-path tests start a real server; install Debian's package when missing.
prometheus:
	@bash scripts/ensure-prometheus.sh

test: $(STAMP) prometheus
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

demo: $(STAMP)
	$(BIN)/governor demo

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# Regenerate the committed gRPC stubs (governor_api/) from proto/ with grpcio-tools.
proto: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/gen_proto.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
