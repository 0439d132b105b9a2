"""The attention backends by name, best first: import-free, so that the engine settings check a name
without loading torch (`attention_backend`)."""

AUTO = "auto"
# name -> "module:class" of its `AttentionBackend`, best first.
BACKENDS = {
    "cpu_paged": "tritonlm.worker.attention.cpu_paged:CpuPagedBackend",
    "sdpa": "tritonlm.worker.attention.sdpa:SdpaBackend",
}
NAMES = (AUTO, *BACKENDS)
# `kv_cache_dtype`: `auto` stores the model's dtype; `int8`, int8 with a scale per token and KV head,
# which only backends listing it in `AttentionBackend.kv_cache_dtypes` read.
KV_CACHE_DTYPES = (AUTO, "int8")
