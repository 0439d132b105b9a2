"""`transformers`: the model's own modules, for every architecture: attention through the backend
transformers calls (`AttentionBackend.register`), LoRA through the projection hooks (`lora/layers.py`)."""

from __future__ import annotations

import torch
from torch import nn

from tritonlm.lora.layers import LoraLayers
from tritonlm.platforms.base import Platform
from tritonlm.worker.attention.base import AttentionBackend
from tritonlm.worker.model_paths.base import ForwardInputs, ModelPath


class TransformersPath(ModelPath):
    name = "transformers"
    runs_lora = True

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.lora = LoraLayers(model)  # adapters' hooks, installed when one first runs

    @classmethod
    def build(cls, model: nn.Module, attention: AttentionBackend, platform: Platform) -> ModelPath | str:
        return cls(model, platform.device)

    def __call__(self, inputs: ForwardInputs) -> torch.Tensor:
        if inputs.embeds is None:
            fed = {"input_ids": inputs.input_ids[None]}
        else:
            fed = {"inputs_embeds": inputs.embeds[None]}
        keep = inputs.keep
        # Every row kept (a decode step): 0, which keeps all without copying `keep` to the device
        # (a CUDA graph's capture allows no such copy).
        every = len(keep) == inputs.positions.shape[0] and keep == list(range(len(keep)))
        to_keep = 0 if every else torch.tensor(keep, dtype=torch.long, device=self.device)
        with self.lora.step(inputs.adapters, inputs.rows, self.device):
            out = self.model(
                **fed, position_ids=inputs.positions[None], use_cache=False, logits_to_keep=to_keep
            )
        logits = out.logits[0]
        if logits.shape[0] != len(keep):  # a model that ignores logits_to_keep (e.g. Qwen2Audio)
            logits = logits[torch.tensor(keep, dtype=torch.long, device=logits.device)]
        return logits
