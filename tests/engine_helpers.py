"""Builds engine requests for tests the way the Triton adapter does (an immutable Request, which
`Engine.add` turns into the Sequence that runs it), and bare Sequences for the scheduler's tests."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator

import torch
from transformers import AutoModelForCausalLM

from tritonlm.config import EngineConfig
from tritonlm.engine.loop import Engine
from tritonlm.engine.request import Request
from tritonlm.engine.sequence import Sequence
from tritonlm.sampling.params import SamplingParams
from tritonlm.worker import fused, step_inputs
from tritonlm.worker.model_runner import ModelRunner


def request(
    prompt: Iterable[int],
    max_new_tokens: int,
    params: SamplingParams | None = None,
    *,
    stop_words: Iterable[Iterable[int]] = (),
    **request_fields: object,
) -> Request:
    return Request(
        tuple(prompt),
        max_new_tokens,
        params or SamplingParams(),
        stop_words=tuple(tuple(w) for w in stop_words),
        **request_fields,
    )


def sequence(
    prompt: Iterable[int],
    max_new_tokens: int,
    params: SamplingParams | None = None,
    *,
    stop_words: Iterable[Iterable[int]] = (),
    **request_fields: object,
) -> Sequence:
    """A bare sequence, for the scheduler and the block manager (the engine builds its own from a
    request: `Engine.add`)."""
    return Sequence(request(prompt, max_new_tokens, params, stop_words=stop_words, **request_fields))


def reference_model(model_dir: object, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """transformers' model with the projections the engine runs by default (`fuse_projections`):
    logits compared at float32 noise (1e-4) need the same matrix multiplies on both sides, since
    oneDNN's pre-packed sgemm sums in another order than MKL's (test_fused.py compares the two)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    fused.fuse(model)
    return model


def fp32_runner(model_dir: object, attention_backend: str, **settings: object) -> ModelRunner:
    """A float32 runner of `model_dir` on one attention backend (the parity tests run on each)."""
    return ModelRunner(
        EngineConfig(str(model_dir), attention_backend=attention_backend, dtype="float32", **settings)
    )


def run_all(
    runner: ModelRunner, requests: list[Request], stagger: bool = False, tokenizer=None
) -> tuple[Engine, list[Sequence]]:
    """Runs the engine loop until every request finished; `stagger` admits them while others run.
    Returns the engine and the requests' sequences."""
    done = threading.Semaphore(0)
    engine = Engine(runner, lambda seq, n: seq.out.finish_reason and done.release(), tokenizer=tokenizer)
    thread = threading.Thread(target=engine.run, daemon=True)
    thread.start()
    seqs = []
    for i, req in enumerate(requests):
        seqs.append(engine.add(req))
        if stagger and i % 3 == 2:
            done.acquire(timeout=60)  # add the next ones while the rest are mid-generation
            done.release()
    for _ in seqs:
        assert done.acquire(timeout=60)
    engine.stop()
    thread.join(10)
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["running"] == stats["waiting"] == 0
    return engine, seqs


def generate_beams(model: torch.nn.Module, prompt: list[int], width: int, new: int) -> list[list[int]]:
    """transformers `generate`'s `width` beams after `prompt` (end id 0, early stopping), each cut
    after its end token, as the engine's beam results hold them."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), num_beams=width, num_return_sequences=width, do_sample=False,
            max_new_tokens=new, early_stopping=True, eos_token_id=0, pad_token_id=0,
        )  # fmt: skip
    beams = []
    for row in out:
        tokens = row[len(prompt) :].tolist()
        beams.append(tokens[: tokens.index(0) + 1] if 0 in tokens else tokens)
    return beams


@contextlib.contextmanager
def swapped(owner: object, name: str, value: object) -> Iterator[None]:
    """`owner.name` set to `value` inside, restored after."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def compare_steps(
    runner: ModelRunner,
    took: Callable[[object], bool],
    switched_off: Callable[[], contextlib.AbstractContextManager],
    atol: float = 0.0,
) -> list[int]:
    """Runs staggered requests; each step the feature under test `took` (asked after the step) is
    run again with it `switched_off` (writing the same keys and values again), and the logits
    compared: bitwise, or within `atol` with the same greedy choices. Returns the batch sizes
    compared; the greedy tokens are the feature's."""
    execute = runner.execute
    compared = []

    def both(work):
        out = execute(work)
        if took(work):
            with switched_off():
                reference = execute(work)
            if atol == 0:
                assert torch.equal(out.logits, reference.logits)
            else:
                torch.testing.assert_close(out.logits, reference.logits, rtol=0, atol=atol)
            assert torch.equal(out.logits.argmax(-1), reference.logits.argmax(-1))
            compared.append(len(work))
        return out

    runner.execute = both
    prompts = [list(range(10, 80)), [5, 6, 7], list(range(100, 130))]
    run_all(runner, [request(p, 10, SamplingParams()) for p in prompts], stagger=True)
    return compared


def compare_graph_steps(runner: ModelRunner, atol: float) -> list[int]:
    """`compare_steps` of the decode graphs: each decode step they take against the ordinary step."""
    graphs = runner.decode_graphs

    def took(work) -> bool:
        step = step_inputs.build(work, runner.attention)
        return graphs.runs(step.packed, list(range(len(work))), bool(step.embed_at), [None])

    return compare_steps(runner, took, lambda: swapped(runner, "decode_graphs", None), atol)
