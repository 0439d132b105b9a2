"""Guides → compiled xgrammar grammars: one compiler per model, compilation on a thread pool (never
on the engine loop), results cached by guide."""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import xgrammar as xgr

from tritonlm.contract import GUIDE_TYPES
from tritonlm.errors import InvalidRequest

GUIDE_TENSOR = "guided_decoding_guide"  # errors name the tensor; the frontend renames it


@dataclass(frozen=True)
class Guide:
    """Guided decoding: `type` is one of contract.GUIDE_TYPES; `text` the schema, regex, grammar or
    structural tag ("" for type json: any JSON object)."""

    type: str
    text: str = ""


# "json" (TensorRT-LLM's JSON mode; OpenAI's json_object): any JSON object.
_ANY_OBJECT = '{"type": "object"}'
# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: " and maybe "Check failed: ... : ".
_NOISE = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")


# xgrammar 0.2.8 writes a length-bounded string (minLength / maxLength) as characters of
# `[^"\\\r\n]`, which lets raw control characters through (invalid in JSON); its unbounded strings
# exclude them. The bounded class is narrowed to the unbounded one's (escapes stay out of both).
_BOUNDED_STRING_CHAR = r"[^\"\\\r\n]"
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\\r\n]"


def json_schema_grammar(schema: str) -> xgr.Grammar:
    """The grammar of JSON matching `schema`, without free whitespace and without raw control
    characters in any string."""
    ebnf = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
    return xgr.Grammar.from_ebnf(ebnf.replace(_BOUNDED_STRING_CHAR, _JSON_STRING_CHAR))


def _message(error: Exception) -> str:
    text = str(error).strip()
    return _NOISE.sub("", text.splitlines()[0] if text else type(error).__name__)


class Grammars:
    """Compiles guides for one model's vocabulary.

    `vocab_size` is the model's logits width (it may exceed the tokenizer's length: padded
    embeddings); tokens beyond the tokenizer are never allowed. JSON is compiled without free
    whitespace (xgrammar's `any_whitespace=False`): a model may otherwise loop on spaces forever.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, workers: int = 2, cache_size: int = 256):
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        # Two compiles at a time: one slow guide does not hold every other guided request.
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grammar-compile")
        self.cache: OrderedDict[tuple[str, str], Future[xgr.CompiledGrammar]] = OrderedDict()
        self.cache_size = cache_size
        self.lock = threading.Lock()

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    def compile(self, guide_type: str, guide: str) -> Future[xgr.CompiledGrammar]:
        """The compiled grammar, soon: a done future when cached. A bad guide makes the future
        raise `InvalidRequest` naming the guide tensor."""
        key = (guide_type, guide)
        with self.lock:
            future = self.cache.get(key)
            if future is None:
                future = self.pool.submit(self._compile, guide_type, guide)
                self.cache[key] = future
                while len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
            else:
                self.cache.move_to_end(key)
        return future

    def _compile(self, guide_type: str, guide: str) -> xgr.CompiledGrammar:
        try:
            return self._build(guide_type, guide)
        except InvalidRequest:
            raise
        except Exception as error:  # xgrammar reports bad guides as RuntimeError / ValueError
            raise InvalidRequest(f"{GUIDE_TENSOR}: invalid {guide_type}: {_message(error)}") from None

    def _build(self, guide_type: str, guide: str) -> xgr.CompiledGrammar:
        compiler = self.compiler
        if guide_type == "json":
            return compiler.compile_grammar(json_schema_grammar(guide or _ANY_OBJECT))
        if guide_type == "json_schema":
            try:
                schema = json.loads(guide)
            except ValueError as error:
                raise InvalidRequest(f"{GUIDE_TENSOR}: the JSON schema is not valid JSON: {error}") from None
            if not isinstance(schema, (dict, bool)):
                raise InvalidRequest(f"{GUIDE_TENSOR}: a JSON schema must be an object")
            return compiler.compile_grammar(json_schema_grammar(guide))
        if guide_type == "regex":
            return compiler.compile_regex(guide)
        if guide_type == "ebnf_grammar":
            return compiler.compile_grammar(guide)
        if guide_type == "structural_tag":
            return compiler.compile_structural_tag(guide)
        raise ValueError(f"{guide_type!r} is not one of {GUIDE_TYPES}: read_guide lets none through")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
