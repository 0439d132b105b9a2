"""Loads a transformers causal LM, sizes the paged KV cache, and runs one packed forward step."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tritonlm.config import EngineConfig
from tritonlm.engine.sequence import Sequence
from tritonlm.worker import kv_cache
from tritonlm.worker.kv_cache import DecodeWorkspace, PagedKVCache, PrefillPart, ShapeProbe, StepLayout

log = logging.getLogger(__name__)


def available_cpu_memory() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


@dataclass
class StepOutput:
    logits: torch.Tensor  # [sequences sampled this step, vocab], in the order they were passed
    all_logits: dict[int, torch.Tensor]  # index of a `keep_all` sequence -> [its new tokens, vocab]


class ModelRunner:
    def __init__(self, config: EngineConfig):
        config = config.resolved()
        checkpoint = AutoConfig.from_pretrained(config.model_dir)
        self.device = config.torch_device()
        self.dtype = config.torch_dtype(self.device, getattr(checkpoint, "dtype", None))
        self.cache = PagedKVCache(config.block_size, self.dtype, self.device)
        self.model = AutoModelForCausalLM.from_pretrained(
            config.model_dir, dtype=self.dtype, attn_implementation=kv_cache.register(self.cache)
        ).to(self.device)
        self.model.eval()
        self.vocab_size = self.model.get_output_embeddings().weight.shape[0]

        shapes = self._probe_shapes()
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
        else:
            free = available_cpu_memory()
        # The resolved settings: max_seq_len and kv_cache_blocks are now concrete numbers.
        self.config = config.kv_cache_size(self.cache.bytes_per_block(shapes), self.device.type, free)
        self.cache.allocate(self.config.kv_cache_blocks, shapes)
        if self.device.type == "cpu":  # see DecodeWorkspace; on a GPU gathering the blocks is cheap
            self.cache.workspace = DecodeWorkspace(
                self.cache,
                self.config.max_num_seqs,
                self.config.max_seq_len,
                max(self.cache.memory_bytes() // 2, 256 << 20),
            )
        log.info(
            "engine settings: %s (device %s, dtype %s, KV cache %.1f MiB)",
            self.config.describe(),
            self.device,
            self.dtype,
            self.cache.memory_bytes() / 2**20,
        )

    @torch.inference_mode()
    def _probe_shapes(self) -> dict[int, tuple[int, int, torch.dtype]]:
        """Runs two tokens through the model to learn each layer's KV heads and head size."""
        self.cache.probe = ShapeProbe()
        try:
            ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
            self.model(input_ids=ids, position_ids=torch.arange(2, device=self.device)[None], use_cache=False)
            return self.cache.probe.layers
        finally:
            self.cache.probe = None

    def reset(self) -> None:
        """Forgets per-step state kept across steps (after a failed step)."""
        if self.cache.workspace is not None:
            self.cache.workspace.reset()

    @torch.inference_mode()
    def forward(
        self,
        seqs: list[Sequence],
        num_new: list[int],
        sample: list[bool],
        keep_all: list[bool] | None = None,
        copies: list[tuple[int, int]] | None = None,
    ) -> StepOutput:
        """One packed step: feeds tokens [num_computed, num_computed + num_new[i]) of each sequence
        (their blocks already allocated) and returns the last-token logits of each sequence with
        `sample[i]`, plus all logits of the new tokens of each sequence with `keep_all[i]`.
        `copies` are copy-on-write block pairs to apply first."""
        if copies:
            self.cache.copy_blocks(copies)
        keep_all = keep_all or [False] * len(seqs)
        bs = self.config.block_size
        # Decoding sequences (one new token) first: they share one batched attention call.
        decodes = [i for i, n in enumerate(num_new) if n == 1]
        num_decodes = len(decodes)
        workspace = self.cache.workspace
        plan = workspace.prepare([seqs[i] for i in decodes], bs) if workspace and decodes else None
        rows, fills = plan if plan is not None else (None, [])
        if rows is not None:  # in workspace row order
            decodes = [decodes[j] for j in rows]
        order = decodes + [i for i, n in enumerate(num_new) if n > 1]

        tokens: list[int] = []
        positions: list[int] = []
        slot_list: list[int] = []
        lengths: list[int] = []
        for i in order[:num_decodes]:
            seq = seqs[i]
            p = seq.num_computed
            tokens.append(seq.token_slice(p, p + 1)[0])
            positions.append(p)
            slot_list.append(seq.block_table[p // bs] * bs + p % bs)
            lengths.append(p + 1)
        input_ids = torch.tensor(tokens, dtype=torch.long)
        position_ids = torch.tensor(positions, dtype=torch.long)
        slot_mapping = torch.tensor(slot_list, dtype=torch.long)

        decode_slots = decode_mask = decode_positions = None
        longest = max(lengths, default=0)
        if num_decodes and min(lengths) != longest:
            valid = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]
            decode_mask = valid[:, None, None, :].to(self.device)
        if rows is not None:
            decode_positions = position_ids.to(self.device)
        elif num_decodes:
            width = -(-longest // bs)
            null_block = self.config.kv_cache_blocks
            table = torch.tensor(
                [
                    seqs[i].block_table[:width] + [null_block] * (width - len(seqs[i].block_table[:width]))
                    for i in order[:num_decodes]
                ]
            )
            decode_slots = (table[:, :, None] * bs + torch.arange(bs)).reshape(num_decodes, -1)[:, :longest]
            if decode_mask is not None:
                decode_slots = decode_slots.masked_fill(~valid, self.cache.null_slot)
            decode_slots = decode_slots.to(self.device)

        parts: list[PrefillPart] = []
        chunks_ids, chunks_pos, chunks_slots = [input_ids], [position_ids], [slot_mapping]
        offset = num_decodes
        for i in order[num_decodes:]:
            seq, n = seqs[i], num_new[i]
            start = seq.num_computed
            table = torch.tensor(seq.block_table, dtype=torch.long)
            pos = torch.arange(start + n)
            all_slots = table[pos // bs] * bs + pos % bs
            chunks_ids.append(torch.tensor(seq.token_slice(start, start + n), dtype=torch.long))
            chunks_pos.append(pos[start:])
            chunks_slots.append(all_slots[start:])
            if start == 0:
                parts.append(PrefillPart(offset, n, 0, None, None))
            else:
                mask = pos[None, :] <= pos[start:, None]
                parts.append(PrefillPart(offset, n, start, all_slots.to(self.device), mask.to(self.device)))
            offset += n

        # Logits to keep: the last token of each sampled sequence, every token of keep_all ones.
        keep: list[int] = []
        sample_row: dict[int, int] = {}
        all_rows: dict[int, tuple[int, int]] = {}
        offset = 0
        for i in order:
            n = num_new[i]
            if keep_all[i]:
                all_rows[i] = (len(keep), len(keep) + n)
                keep.extend(range(offset, offset + n))
                if sample[i]:
                    sample_row[i] = len(keep) - 1
            elif sample[i]:
                sample_row[i] = len(keep)
                keep.append(offset + n - 1)
            offset += n

        self.cache.layout = StepLayout(
            slot_mapping=torch.cat(chunks_slots).to(self.device),
            num_decodes=num_decodes,
            decode_slots=decode_slots,
            decode_mask=decode_mask,
            prefills=parts,
            decode_positions=decode_positions,
            decode_length=longest,
            workspace_fills=fills,
        )
        try:
            out = self.model(
                input_ids=torch.cat(chunks_ids).to(self.device)[None],
                position_ids=torch.cat(chunks_pos).to(self.device)[None],
                use_cache=False,
                logits_to_keep=torch.tensor(keep, dtype=torch.long, device=self.device),
            )
        finally:
            self.cache.layout = None
        logits = out.logits[0]
        sample_rows = [sample_row[i] for i in range(len(seqs)) if i in sample_row]
        if sample_rows != list(range(len(sample_rows))) or len(sample_rows) != logits.shape[0]:
            logits_sampled = logits[torch.tensor(sample_rows, dtype=torch.long, device=self.device)]
        else:
            logits_sampled = logits
        return StepOutput(logits_sampled, {i: logits[a:b] for i, (a, b) in all_rows.items()})
