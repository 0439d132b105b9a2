"""Converts a Hugging Face PEFT LoRA directory into the engine's LoRA tensors, for gRPC clients.

    python -m client.lora PEFT_DIR OUT_DIR

writes OUT_DIR/model.lora_weights.npy ([rows, D] float32) and OUT_DIR/model.lora_config.npy
([rows, 3] int32: module_id, layer_idx, adapter_size), TensorRT-LLM's file names and layout
(`examples/hf_lora_convert.py`) without its leading batch dimension of 1. Send them once with a
`lora_task_id` (e.g. `python -m client.stream ... --lora-dir OUT_DIR --lora-task-id 7`); later
requests send the id alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from tritonlm.lora.format import AdapterFormatError, peft_to_tensors

WEIGHTS_FILE = "model.lora_weights.npy"
CONFIG_FILE = "model.lora_config.npy"


def load(out_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The two tensors from a converted directory; TensorRT-LLM's files ([1, rows, …]) work too."""
    out_dir = Path(out_dir)
    weights, config = np.load(out_dir / WEIGHTS_FILE), np.load(out_dir / CONFIG_FILE)
    if weights.ndim == 3 and weights.shape[0] == 1:
        weights, config = weights[0], config[0]
    return weights.astype(np.float32), config.astype(np.int32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m client.lora",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("peft_dir", type=Path, help="adapter_config.json + adapter_model.safetensors")
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        weights, config = peft_to_tensors(args.peft_dir)
    except AdapterFormatError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    args.out_dir.mkdir(parents=True, exist_ok=True)
    np.save(args.out_dir / WEIGHTS_FILE, weights)
    np.save(args.out_dir / CONFIG_FILE, config)
    print(f"{args.out_dir}: lora_weights {list(weights.shape)} float32, lora_config {list(config.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
