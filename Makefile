# Two commands for a fresh machine with only Python:
#   make conformance   run the conformance suite on the simulator against accelerate_ref
#   make test          run the project's own tests
# Both create .venv if it is missing and install the project into it.

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
IMPL       ?= accelerate_ref
BACKENDS   ?= sim
WORLDS     ?= 1,2,3,4,2x2
REPORTS    ?= reports
PYTEST_ARGS ?=

PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: conformance conformance-hf test bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test,hf]"
	@touch $@

conformance: $(STAMP)
	$(PY) -m conformance run --impl $(IMPL) --backend $(BACKENDS) --worlds $(WORLDS) \
		--json $(REPORTS)/conformance-$(IMPL).json --junit $(REPORTS)/conformance-$(IMPL).xml \
		--markdown $(REPORTS)/conformance-$(IMPL).md --html $(REPORTS)/conformance-$(IMPL).html

conformance-hf:
	$(MAKE) conformance IMPL=accelerate

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/suite_speed.py

clean:
	rm -rf $(VENV) $(REPORTS) .pytest_cache .tox *.egg-info
