"""The model paths by name, and which architecture runs on which platform's fast path: import-free,
so that the engine settings check `model_path` without loading torch.

A new fast path is one module (a `ModelPath`) and a line in each table below."""

AUTO = "auto"
GENERIC = "transformers"
# name -> "module:class" of its `ModelPath`.
PATHS = {
    GENERIC: "tritonlm.worker.model_paths.generic:TransformersPath",
    "decoder_stack": "tritonlm.worker.model_paths.decoder_stack:DecoderStack",
}
# (architecture as config.json names it, platform) -> the fast path `auto` takes for it.
FAST_PATHS = {
    # decoder_stack.FAMILIES' architectures (tests/worker/test_decoder_stack.py keeps them equal)
    ("LlamaForCausalLM", "cpu"): "decoder_stack",
    ("Qwen2ForCausalLM", "cpu"): "decoder_stack",
    ("MistralForCausalLM", "cpu"): "decoder_stack",
    ("Qwen3ForCausalLM", "cpu"): "decoder_stack",
    ("GraniteForCausalLM", "cpu"): "decoder_stack",
    ("Phi3ForCausalLM", "cpu"): "decoder_stack",
}
NAMES = (AUTO, *PATHS)
