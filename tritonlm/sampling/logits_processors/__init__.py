"""Logits processors: the rules that change next-token logits before the sampling step, each in its
own module, run as one ordered pipeline over the whole batch (base.py has the interface).

The engine's order (`default_pipeline`), transformers' and TGI's:

1. embedding bias                 (embedding_bias.py)
2. repetition penalty             (repetition_penalty.py)   prompt + output
3. presence/frequency penalties   (presence_frequency.py)   output only (OpenAI)
4. no-repeat n-grams              (no_repeat_ngram.py)
5. bad words                      (bad_words.py)
6. min_length                     (min_length.py)           bans the end id and one-token stop words
7. watermark                      (watermark.py)            gamma/delta: the engine's settings
8. grammar token mask              (grammar.py)              structured output: last, so that what
   it forbids stays forbidden whatever the others add

The bans (4-6) only write -inf, so their order among themselves does not matter; the value changes
(1-3, 7) do not commute, hence the fixed order. Sampling runs the pipeline on raw logits, beam
search on log probs. Temperature, top-k/top-p/typical-p and the draw are the sampling step itself
(tritonlm.sampling.sampler), not processors.
"""

from __future__ import annotations

from tritonlm.config import EngineConfig
from tritonlm.sampling.logits_processors.bad_words import BadWords
from tritonlm.sampling.logits_processors.base import LogitsPipeline, LogitsProcessor
from tritonlm.sampling.logits_processors.embedding_bias import EmbeddingBias
from tritonlm.sampling.logits_processors.grammar import GrammarMask
from tritonlm.sampling.logits_processors.min_length import MinLength
from tritonlm.sampling.logits_processors.no_repeat_ngram import NoRepeatNGram
from tritonlm.sampling.logits_processors.presence_frequency import PresenceFrequencyPenalty
from tritonlm.sampling.logits_processors.repetition_penalty import RepetitionPenalty
from tritonlm.sampling.logits_processors.watermark import Watermark

__all__ = [
    "BadWords",
    "EmbeddingBias",
    "GrammarMask",
    "LogitsPipeline",
    "LogitsProcessor",
    "MinLength",
    "NoRepeatNGram",
    "PresenceFrequencyPenalty",
    "RepetitionPenalty",
    "Watermark",
    "default_pipeline",
]


def default_pipeline(config: EngineConfig | None = None) -> LogitsPipeline:
    """The engine's processors in the order above, with the settings of `config` (default: the
    settings' defaults)."""
    config = EngineConfig() if config is None else config
    return LogitsPipeline(
        [
            EmbeddingBias(),
            RepetitionPenalty(),
            PresenceFrequencyPenalty(),
            NoRepeatNGram(),
            BadWords(),
            MinLength(),
            Watermark(config.watermark_gamma, config.watermark_delta),
            GrammarMask(),
        ]
    )
