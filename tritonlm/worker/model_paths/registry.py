"""The model paths by name, and which architecture runs on which platform's fast path: import-free,
so that the engine settings check `model_path` without loading torch.

A new fast path is one module (a `ModelPath`) and a line in each table below."""

AUTO = "auto"
GENERIC = "transformers"
# name -> "module:class" of its `ModelPath`.
PATHS = {
    GENERIC: "tritonlm.worker.model_paths.generic:TransformersPath",
    "llama_stack": "tritonlm.worker.model_paths.llama_stack:LlamaStack",
}
# (architecture as config.json names it, platform) -> the fast path `auto` takes for it.
FAST_PATHS = {
    ("LlamaForCausalLM", "cpu"): "llama_stack",
}
NAMES = (AUTO, *PATHS)
