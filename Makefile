# Two commands for a fresh machine with only Python:
#   make conformance   run the conformance suite against accelerate_ref on the simulator's
#                      CPU, mock XLA and mock NPU worlds (one JSON per backend, one matrix)
#   make test          run the project's own tests
# Both create .venv if it is missing and install the project into it.

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
IMPL       ?= accelerate_ref
BACKENDS   ?= sim sim-xla sim-npu
WORLDS     ?= 1,2,3,4,2x2
# The conformance level: docs-0.27, docs-1.x or hf-1.15 (what the run holds the implementation to).
LEVEL      ?= hf-1.15
# Only the cases whose ID or name matches one of these shell-style patterns, e.g. CASES="gather* launch.cli"
# (default: every case).
CASES      ?=
# What `make conformance` builds before the suite: DeepSpeed's CPU ops (empty: nothing; the DeepSpeed cases then
# build them with torch's JIT themselves).
PREBUILD   ?= deepspeed-ops
REPORTS    ?= reports
PYTEST_ARGS ?=
# pytest workers for `make test` (pytest-xdist): the rank processes of one test leave most of a second
# core idle, so two workers finish in about half the time on a 2-core machine.
JOBS       ?= 2

PY    := $(VENV)/bin/python
# Python writes each module's bytecode the first time a process imports it, also where the environment sets
# PYTHONDONTWRITEBYTECODE (as this machine and CI do): otherwise every rank, command and fork server would compile
# torch and the project from source again. Only what runs is compiled: importing torch, Transformers, peft, TRL,
# DeepSpeed and plotly compiles 4,834 of the environment's 19,344 files, where compiling them all beforehand took
# 29 s on a 2-core machine (2026-11-30).
unexport PYTHONDONTWRITEBYTECODE
STAMP := $(VENV)/.installed
# Issue 34: Transformers 4 beside the venv's Transformers 5, for HF accelerate 1.15's FSDP2 + tensor parallelism, which
# imports Transformers 4's ReplicateParallel (5 removed it): the ND dry runs' tp rows put it first on their import path.
TRANSFORMERS4 := $(VENV)/transformers4
MUTATION_STAMP := $(VENV)/.installed-mutation
# Options of `python -m conformance mutation`, e.g. MUTATION_ARGS="--module hooks --sample 10".
MUTATION_ARGS ?=

# Ranks per machine of `make conformance-native` (torchrun's --nproc_per_node): one per GPU, 1 without any.
NPROC      ?= $(shell $(PY) -c "import torch; print(max(torch.cuda.device_count(), 1))" 2>/dev/null || echo 1)

.PHONY: conformance conformance-hf conformance-native test extended bench clean faults scale shipped lint mutation docs deepspeed-ops

# pip writes no bytecode (--no-compile): the processes that import a module write its bytecode (see above), where
# pip would write it for every file on one core (about 76 CPU-s, half of this recipe's time on a 2-core machine).
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile "$(TORCH_SPEC)" -e ".[test,hf,transformers,trackers,finetune,docs,report]"
	# --no-deps, so pip never replaces torch: bitsandbytes, whose CPU backend runs the 8-bit case (extra "bnb");
	# DeepSpeed (an sdist; its setup imports torch only to pre-compile ops, which it skips) and its requirements
	# (extra "deepspeed"; pydantic comes with the trackers); torchdata, whose StatefulDataLoader backs
	# use_stateful_dataloader (its metadata pins torch); lomo-optim (12 kB, pure Python), which runs the LOMO
	# route of backward.
	$(PY) -m pip install --quiet --no-compile --no-deps "bitsandbytes>=0.45" "deepspeed>=0.16" hjson msgpack ninja \
		psutil py-cpuinfo einops "torchdata==0.11.0" "lomo-optim>=0.1.1"
	@touch $@

# --no-deps: the rest of Transformers 4.57's requirements are the venv's; these three are the versions it accepts.
$(TRANSFORMERS4)/.installed: $(STAMP)
	$(PY) -m pip install --quiet --no-compile --no-deps --upgrade --target $(TRANSFORMERS4) \
		"transformers==4.57.6" "huggingface_hub==0.36.2" "tokenizers==0.22.2"
	@touch $@

# The releases the documents describe, each beside the venv's HF 1.15 (--no-deps: pure Python, the venv's torch):
# the conformance levels are proven on them (tests/conformance/test_releases.py puts one first on the ranks' path).
RELEASES := $(VENV)/releases
$(RELEASES)/.installed: $(STAMP)
	$(PY) -m pip install --quiet --no-compile --no-deps --upgrade --target $(RELEASES)/accelerate-0.27.2 "accelerate==0.27.2"
	$(PY) -m pip install --quiet --no-compile --no-deps --upgrade --target $(RELEASES)/accelerate-1.0.1 "accelerate==1.0.1"
	@touch $@

# Every backend runs even when one fails; the matrix puts them side by side; the exit status is
# that of the worst run. The cases whose outcome cannot depend on the device family
# (conformance/device_independent.toml) run on the first backend only.
conformance: $(STAMP) $(PREBUILD)
	@status=0; skip=; for backend in $(BACKENDS); do \
		$(PY) -m conformance run --impl $(IMPL) --backend $$backend --worlds $(WORLDS) --level $(LEVEL) $$skip \
			$(foreach pattern,$(CASES),-k '$(pattern)') \
			--json $(REPORTS)/conformance-$(IMPL)-$$backend.json \
			--junit $(REPORTS)/conformance-$(IMPL)-$$backend.xml || status=1; \
		skip=--skip-device-independent; \
	done; \
	$(PY) -m conformance report $(foreach backend,$(BACKENDS),$(REPORTS)/conformance-$(IMPL)-$(backend).json) \
		--markdown $(REPORTS)/conformance-$(IMPL).md --html $(REPORTS)/conformance-$(IMPL).html \
		--statement $(REPORTS)/statement-$(IMPL)-$(LEVEL).md || status=1; \
	exit $$status

# DeepSpeed builds its CPU ops (CPU Adam for an offloaded optimizer, its shared-memory collectives) with torch's JIT
# on first use: about a minute each on 2 cores, into ~/.cache/torch_extensions. They are built here, before the
# suite, so that no case's time (or timeout) holds a compiler run; this takes seconds once they are built.
deepspeed-ops: $(STAMP)
	@echo "DeepSpeed's CPU ops: built by torch's JIT unless built already (about two minutes the first time)"
	@$(PY) -c "import importlib.util, sys; importlib.util.find_spec('deepspeed') or sys.exit(); \
		from deepspeed.accelerator import get_accelerator; \
		[get_accelerator().create_op_builder(name).load(verbose=False) for name in ('CPUAdamBuilder', 'ShareMemCommBuilder')]" \
		>/dev/null 2>&1 || echo "DeepSpeed's CPU ops did not build here: its cases build them again and report what fails"

conformance-hf:
	$(MAKE) conformance IMPL=accelerate

# Issue 32: the suite on this machine's real devices, ranks started by torchrun (a GPU runner's job; the
# bundled manifest of $(IMPL) applies). Reports: $(REPORTS)/conformance-$(IMPL)-native.{json,xml,md}.
conformance-native: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m torch.distributed.run --nproc_per_node $(NPROC) --master_port $(shell $(PY) -c "from simulators.ports import free_port; print(free_port())") \
		-m conformance run --backend native --impl $(IMPL) \
		--json $(REPORTS)/conformance-$(IMPL)-native.json --junit $(REPORTS)/conformance-$(IMPL)-native.xml \
		--markdown $(REPORTS)/conformance-$(IMPL)-native.md

test: $(STAMP) $(TRANSFORMERS4)/.installed $(RELEASES)/.installed lint
	$(PY) -m pytest -n $(JOBS) $(PYTEST_ARGS)

# The documentation site: docs/ (Markdown pages, the CLI and API reference generated from the sources) to
# docs/_build/html; warnings are errors. `make test` builds it the same way (tests/test_docs.py).
docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

# The linter's rules are in pyproject.toml ([tool.ruff]).
lint: $(STAMP)
	$(PY) -m ruff check accelerate_ref simulators conformance tests benchmarks
	$(VENV)/bin/lint-imports --no-cache

# The expensive variants kept out of `make test` (marker `extended`).
extended: $(STAMP) $(TRANSFORMERS4)/.installed $(RELEASES)/.installed
	$(PY) -m pytest -m extended $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/suite_speed.py

# Issue 14: the fault catalog's table, and rank start-up time and PSS at 8/16/32/64 ranks (heavy: take the lock).
faults: $(STAMP)
	$(PY) -m tests.simulators.faults

scale: $(STAMP)
	$(PY) benchmarks/scale.py

# Issue 20: HF's shipped self-test scripts (accelerate/test_utils/scripts) at 2 ranks, on HF and with
# `import accelerate` switched to $(IMPL), side by side (minutes: take the lock).
shipped: $(STAMP)
	$(PY) -m conformance shipped --impl $(IMPL) --markdown $(REPORTS)/shipped-$(IMPL).md

# Issue 24: mutation testing of accelerate_ref against slices of the suite (conformance/mutation.toml), with
# cosmic-ray, installed on first use (extra "mutation"). About an hour by default (heavy: take the lock);
# reports in $(REPORTS)/mutation.json and $(REPORTS)/mutation.md. Not part of `make test`.
$(MUTATION_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[mutation]"
	@touch $@

mutation: $(MUTATION_STAMP)
	$(PY) -m conformance mutation --reports $(REPORTS) $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) $(REPORTS) .pytest_cache .tox *.egg-info
