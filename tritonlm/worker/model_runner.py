"""Loads a transformers causal LM, sizes the paged KV cache, and runs one packed forward step.

Attention goes through the backend the `attention_backend` setting picks (`worker/attention`): it
owns the KV cache and builds each step's attention metadata once, before the forward.

A step (a `StepBatch`: plain data the engine fills; this module never sees the engine's objects)
feeds each sequence's new tokens (`step_inputs` packs them: a decoding sequence feeds its
pending token and any proposals, a prefilling one a chunk of its prompt) and returns, per sequence,
the logits of its last few new tokens (one to sample from; 1 + proposals to verify them) and, for
prompt logits, those of all of them. A step whose tokens include embedding rows
(`StepBatch.embeds`) calls the model with `inputs_embeds`; any other with `input_ids`.

Three seams meet here: the platform (`tritonlm/platforms`: device, dtype `auto`, memory), the linear
methods that hold the projections (`worker/linear`, through `worker/fused.py`) and the model paths
(`worker/model_paths`): a step runs on the model's fast path (`model_path`) when it has one that runs
the step, else through transformers' modules."""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
from transformers import AutoConfig, PretrainedConfig

from tritonlm import gguf_checkpoint, platforms
from tritonlm.config import EngineConfig
from tritonlm.multimodal.encoder import language_model_class
from tritonlm.settings import ConfigError
from tritonlm.step import ModelOutput, StepBatch
from tritonlm.worker import (
    attention,
    fused,
    gguf_weights,
    model_paths,
    model_support,
    moe,
    quantize,
    step_inputs,
)
from tritonlm.worker.attention.base import LayerRule, LayerShape, kv_window
from tritonlm.worker.decode_graph import DecodeGraphs
from tritonlm.worker.model_paths.base import ForwardInputs
from tritonlm.worker.model_paths.generic import TransformersPath
from tritonlm.worker.recurrent_state import RecurrentState

log = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, config: EngineConfig):
        config = config.resolved()
        checkpoint = AutoConfig.from_pretrained(config.model_dir)
        # What no backend serves is refused before the weights load; what the attention needs
        # (a window, soft-capping, sinks) picks a backend that computes it.
        needs = model_support.check_config(checkpoint, config.max_seq_len)
        if model_support.recurrent_layers(checkpoint):
            config = model_support.recurrent_settings(config, model_support.architecture(checkpoint))
        elif config.enable_prefix_caching is None:
            config = replace(config, enable_prefix_caching=True)
        self.platform = platforms.resolve(config.device)
        self.device = self.platform.device
        quantize.check(config.quantization, config.model_dir, self.platform.name)
        self.dtype = config.torch_dtype(self.device, getattr(checkpoint, "dtype", None))
        backend = attention.choose(config.attention_backend, self.device, needs, config.kv_cache_dtype)
        self.attention = backend(config.block_size, self.dtype, self.device, config.kv_cache_dtype)
        self.model = self._load(config, checkpoint).to(self.device)
        self.model.eval()
        quantize.quantize(self.model, config.quantization)  # before fusing groups the projections
        # Before the LoRA hooks go on the projections that replace them.
        if config.fuse_projections and fused.fuse(self.model):
            self.attention.on_fused_projections()
        fused.hold_quantized(self.model)
        # Linear-attention layers' forwards over their state slots (none: a model without them).
        self.recurrent = RecurrentState(self.model, self.device)
        self.generic = TransformersPath(self.model, self.device)
        self.lora = self.generic.lora
        self.fast_path = model_paths.fast_path(config.model_path, self.model, self.attention, self.platform)
        self.vocab_size = self.model.get_output_embeddings().out_features  # a quantized head has no weight
        self.hidden_size = self.model.get_input_embeddings().weight.shape[1]

        shapes = self._probe_shapes()
        needs = model_support.check_probe(checkpoint, self.attention.handed, config.max_seq_len)
        attention.require(backend, needs, self.device, config.kv_cache_dtype)  # what the config did not show
        # Blocks behind every layer's window may go (the engine's BlockManager.slide): only on a
        # backend that masks the window, so it never reads them.
        rules = {layer: LayerRule.of(kw, config.max_seq_len) for layer, kw in self.attention.handed.items()}
        self.kv_window = kv_window(rules) if "sliding_window" in backend.computes else None
        # The resolved settings: max_seq_len and kv_cache_blocks are now concrete numbers.
        # One recurrent-state slot per running sequence, its memory taken out of the KV cache's.
        self.state_slots = config.max_num_seqs if self.recurrent else 0
        self.platform.release_unused_memory()
        self.config = config.kv_cache_size(
            self.attention.bytes_per_block(shapes),
            self.platform.name,
            self.platform.free_memory(),
            reserved_bytes=self.state_slots * self.recurrent.bytes_per_slot(),
        )
        self.attention.allocate(
            self.config.kv_cache_blocks, shapes, self.config.max_num_seqs, self.config.max_seq_len
        )
        self.recurrent.allocate(self.state_slots)
        self.decode_graphs = self._decode_graphs()
        log.info(
            "engine settings: %s (device %s, dtype %s, attention %s, model path %s, KV cache %.1f MiB, "
            "recurrent state %.1f MiB)",
            self.config.describe(),
            self.platform.describe(),
            self.dtype,
            self.attention.name,
            self.fast_path.name if self.fast_path else self.generic.name,
            self.attention.memory_bytes() / 2**20,
            self.recurrent.memory_bytes() / 2**20,
        )

    def _decode_graphs(self) -> DecodeGraphs | None:
        """The decode steps' graphs (`decode_graphs`), made now, or None (off: unset and not CUDA,
        or unset and the step cannot be captured, said in the log); a ConfigError when set true and
        the step cannot be."""
        wanted = self.config.decode_graphs
        if wanted is False or (wanted is None and not self.platform.captures_graphs):
            return None
        try:
            graphs = DecodeGraphs.build(
                self.fast_path or self.generic,
                self.attention,
                self.platform,
                self.config.max_num_seqs,
                self.config.max_seq_len,
                recurrent=bool(self.recurrent),
            )
        except RuntimeError as error:  # the model's forward is not capturable (e.g. a host sync)
            graphs = f"making the graphs failed: {error}"
        if isinstance(graphs, str):
            if wanted:
                raise ConfigError(f"decode_graphs: true cannot run here: {graphs}")
            log.warning("decode_graphs off: %s", graphs)
            return None
        return graphs

    def _load(self, config: EngineConfig, checkpoint: PretrainedConfig) -> torch.nn.Module:
        """The checkpoint's model: from its directory, or from the GGUF file it was written for
        (its 4-bit, Q8_0 and Q6_K projections kept quantized on the CPU)."""
        attn_implementation = self.attention.register()
        file = gguf_checkpoint.weights_file(config.model_dir)
        if file is None:
            model_class = language_model_class(checkpoint)
            experts = moe.experts_implementation(
                config.moe_implementation, model_class, checkpoint, self.device.type
            )
            return model_class.from_pretrained(
                config.model_dir,
                dtype=self.dtype,
                attn_implementation=attn_implementation,
                experts_implementation=experts,
            )
        keep_quantized = self.platform.name == "cpu"
        return gguf_weights.load(
            file, checkpoint, self.dtype, keep_quantized, attn_implementation=attn_implementation
        )

    @torch.inference_mode()
    def _probe_shapes(self) -> dict[int, LayerShape]:
        """Runs two tokens through the model to learn each layer's KV heads and head size."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
        positions = torch.arange(2, device=self.device)[None]
        return self.attention.probe_shapes(
            lambda: self.model(input_ids=ids, position_ids=positions, use_cache=False)
        )

    def reset(self) -> None:
        """Forgets per-step state kept across steps (after a failed step)."""
        self.attention.reset()

    @torch.inference_mode()
    def execute(self, work: StepBatch) -> ModelOutput:
        """One packed step: feeds each sequence's `token_ids` from position `num_computed` (their
        blocks already allocated, the copy-on-write pairs `work.copies` applied first) and returns
        the logits of the last `num_logits[i]` new tokens of each sequence, plus all logits of the
        new tokens of each with `prompt_logits[i]`."""
        num_new = work.num_new
        if work.copies:
            self.attention.copy_blocks(work.copies)
        if work.state_copies:
            self.recurrent.copy_slots(work.state_copies)
        step = step_inputs.build(work, self.attention)
        keep, spans, all_rows = _logits_rows(step.order, num_new, work.num_logits, work.prompt_logits)
        loras = work.loras
        adapters = [loras[i] for i in step.order]
        graphs = self.decode_graphs
        if graphs is not None and graphs.runs(step.packed, keep, bool(step.embed_at), adapters):
            logits = graphs(step.input_ids, step.position_ids, step.packed)
        else:
            logits = self._forward(work, step, keep, adapters, [num_new[i] for i in step.order])
        # The sampled rows, in the scheduler's order (the batch was packed decodes first).
        select: list[int] = []
        offsets = [0]
        for i in range(len(num_new)):
            if i in spans:
                a, b = spans[i]
                select.extend(range(a, b))
            offsets.append(len(select))
        if select != list(range(len(select))) or len(select) != logits.shape[0]:
            logits_sampled = logits[torch.tensor(select, dtype=torch.long, device=self.device)]
        else:
            logits_sampled = logits
        return ModelOutput(logits_sampled, {i: logits[a:b] for i, (a, b) in all_rows.items()}, offsets)

    def _forward(
        self,
        work: StepBatch,
        step: step_inputs.StepInputs,
        keep: list[int],
        adapters: list[object | None],
        rows: list[int],
    ) -> torch.Tensor:
        """The packed step's logits (the `keep` rows) on the model's path: its fast path, or
        transformers' modules for a path that does not run the step's adapters."""
        metadata = self.attention.build_metadata(step.packed)  # once; every layer reads it
        ids = self.platform.to_device(step.input_ids)
        embeds = self._embed(ids, step.embed_at, step.embed_rows) if step.embed_at else None
        positions = self.platform.to_device(step.position_ids)
        path = self.fast_path
        if path is None or (not path.runs_lora and any(adapters)):
            path = self.generic
        states = [work.state_slots[i] for i in step.order] if self.recurrent else []
        with self.attention.step(metadata), self.recurrent.step(step.packed.num_computed, rows, states):
            return path(ForwardInputs(ids, embeds, positions, keep, adapters, rows))

    def _embed(self, ids: torch.Tensor, at: list[int], rows: list[torch.Tensor]) -> torch.Tensor:
        """The model's input embeddings of `ids` [tokens], with `rows` at packed indices `at`."""
        table = self.model.get_input_embeddings()
        # Positions fed a row may hold ids beyond the vocabulary (prompt tables): look up 0 there.
        embeds = table(ids.masked_fill(ids >= table.num_embeddings, 0))
        index = torch.tensor(at, dtype=torch.long, device=self.device)
        embeds[index] = torch.cat(rows).to(device=self.device, dtype=embeds.dtype)
        return embeds


def _logits_rows(
    order: list[int], num_new: list[int], logits_rows: list[int], keep_all: list[bool]
) -> tuple[list[int], dict[int, tuple[int, int]], dict[int, tuple[int, int]]]:
    """The packed tokens whose logits the model computes (`logits_to_keep`), and, per sequence,
    its sampled rows (the last `logits_rows[i]`) and its `keep_all` rows among them."""
    keep: list[int] = []
    spans: dict[int, tuple[int, int]] = {}
    all_rows: dict[int, tuple[int, int]] = {}
    offset = 0
    for i in order:
        n, m = num_new[i], logits_rows[i]
        assert m <= n, f"{m} logits rows asked of {n} new tokens"
        if keep_all[i]:
            all_rows[i] = (len(keep), len(keep) + n)
            keep.extend(range(offset, offset + n))
            if m:
                spans[i] = (len(keep) - m, len(keep))
        elif m:
            spans[i] = (len(keep), len(keep) + m)
            keep.extend(range(offset + n - m, offset + n))
        offset += n
    return keep, spans, all_rows
