"""gRPC tensor client: send text (to `ensemble`) or token ids (to `engine`), stream the tokens back,
and report time to first token and per-token latency.

    python -m client.stream --text "Hello" --max-tokens 32
    python -m client.stream --model engine --ids 1 2 3 --max-tokens 16 --param temperature=0.7 \
        --param runtime_top_p=0.9
    python -m client.stream --text "Hello" --lora-dir converted/ --lora-task-id 7   # then the id alone
    python -m client.stream --text "<image>What is this?" --media image=cat.png   # a multimodal model
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tritonlm import contract

_TYPES = {
    "ensemble": {t.name: t.dtype for t, _ in contract.ENSEMBLE_INPUTS},
    "engine": {t.name: t.dtype for t in contract.ENGINE_INPUTS},
}


def make_inputs(model: str, values: dict[str, object]) -> list[grpcclient.InferInput]:
    """InferInputs from plain values, typed and shaped by the contract (scalars become [1])."""
    inputs = []
    for name, value in values.items():
        dtype = _TYPES[model][name]
        array = np.asarray(value, dtype=contract.NUMPY_DTYPES[dtype])
        if array.ndim == 0:
            array = array.reshape(1)
        if model == "engine" and name in ("input_ids", "request_output_len") and array.ndim == 1:
            array = array[None, :]  # [1, N] and [1, 1], as the TensorRT-LLM tensors are shaped
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


class StreamClient:
    """One gRPC stream; `generate` yields each response's outputs as numpy arrays."""

    def __init__(self, url: str):
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)))

    def generate(self, model: str, values: dict[str, object], timeout: float = 120) -> Iterator[dict]:
        self.client.async_stream_infer(model, make_inputs(model, values), enable_empty_final_response=True)
        while True:
            result, error = self.responses.get(timeout=timeout)
            if error is not None:
                raise RuntimeError(error.message())
            response = result.get_response()
            outputs = {o.name: result.as_numpy(o.name) for o in response.outputs}
            if outputs:
                yield outputs
            if response.parameters["triton_final_response"].bool_param:
                return

    def cancel(self) -> None:
        """Closes the stream, cancelling its requests in the server."""
        self.client.stop_stream(cancel_requests=True)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def _value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="localhost:8001")
    parser.add_argument("--model", choices=["ensemble", "engine"], default="ensemble")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text")
    source.add_argument("--ids", type=int, nargs="+")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--param", action="append", default=[], help="NAME=VALUE, any input of the model")
    parser.add_argument("--lora-task-id", type=int, help="a LoRA task: cached, or sent with --lora-dir")
    parser.add_argument("--lora-dir", help="the task's tensors (`python -m client.lora PEFT_DIR OUT_DIR`)")
    parser.add_argument(
        "--media",
        action="append",
        default=[],
        metavar="KIND=PATH",
        help="an image, video or audio file for a multimodal model, in the order of the text's placeholders",
    )
    args = parser.parse_args(argv)

    if args.model == "ensemble":
        if args.text is None:
            parser.error("--model ensemble takes --text")
        values: dict[str, object] = {"text_input": [args.text], "max_tokens": args.max_tokens, "stream": True}
    else:
        if args.ids is None:
            parser.error("--model engine takes --ids")
        values = {"input_ids": args.ids, "request_output_len": args.max_tokens, "streaming": True}
    for item in args.param:
        name, _, text = item.partition("=")
        values[name] = _value(text)
    if args.lora_task_id is not None:
        values["lora_task_id"] = np.uint64(args.lora_task_id)
    if args.lora_dir:
        from client.lora import load

        values["lora_weights"], values["lora_config"] = load(args.lora_dir)
    if args.media:
        # One request's items, [1, items]: the file's bytes and its kind (the server decodes them).
        kinds, _, paths = zip(*(item.partition("=") for item in args.media), strict=True)
        values["media"] = [[Path(path).read_bytes() for path in paths]]
        values["media_kinds"] = [list(kinds)]

    client = StreamClient(args.url)
    start = last = time.perf_counter()
    gaps: list[float] = []
    first: float | None = None
    try:
        for outputs in client.generate(args.model, values):
            now = time.perf_counter()
            if first is None:
                first = now - start
            else:
                gaps.append(now - last)
            last = now
            if "text_output" in outputs:
                sys.stdout.write(b"".join(outputs["text_output"]).decode("utf-8", "replace"))
            else:
                sys.stdout.write(" " + " ".join(str(i) for i in outputs["output_ids"].reshape(-1)))
            sys.stdout.flush()
    finally:
        client.close()
    print()
    if first is not None:
        per_token = (
            f"{statistics.mean(gaps) * 1e3:.1f} ms mean, {max(gaps) * 1e3:.1f} ms max" if gaps else "n/a"
        )
        print(f"time to first token: {first * 1e3:.1f} ms; per-token latency: {per_token}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
