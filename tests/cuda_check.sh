#!/usr/bin/env bash
# The CUDA checks, in one call on a lent GPU machine (its image's python3 and torch; the pinned
# packages its image lacks carried as wheels in .whl/, which git ignores): the CUDA tests, then
# decode steps of a random SmolLM2-sized Llama in bf16, eager against decode graphs (the default
# there), at 1, 4 and 32 sequences. Logs under $OUT (or /tmp/cuda-check). Not part of `make test`
# (no CUDA here). The wheels, for the image's Python 3.12 (pinned as pyproject.toml pins them):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl transformers==5.23.0 xgrammar==0.2.8 pydantic==2.14.4 pydantic_core==2.50.5 \
#     annotated-types==0.8.0 typing-inspection==0.4.5 apache-tvm-ffi==0.1.15.post2 gguf==0.19.0 \
#     typing-extensions==4.16.0
set -o pipefail
OUT=${OUT:-/tmp/cuda-check}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:$PWD/tests:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.log"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.log"
timeout 240 python3 -m pytest --noconftest -q -p no:cacheprovider tests/worker/test_platforms.py \
    tests/worker/test_cuda_platform.py \
    tests/worker/test_decode_graph.py::test_cuda_graph_replays_on_what_the_static_inputs_hold 2>&1 | tee "$OUT/tests.log"
python3 -c "from pathlib import Path; from tritonlm.model_gen.families import generate; generate('/tmp/smol', 'llama', Path('/none'))"
for batch in 1 4 32; do
    timeout 180 python3 -m client.step_bench --model-dir /tmp/smol --dtype bfloat16 --batch $batch \
        --rounds 3 --decode-steps 32 --prompt-len 145 \
        --variants "device=cuda,kv_cache_blocks=4096,decode_graphs=false" "device=cuda,kv_cache_blocks=4096" \
        2>&1 | grep -v Warning | tee "$OUT/step-bench-$batch.log"
done
