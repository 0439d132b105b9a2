"""The lifetime of a Python-backend stub process: it must end with its tritonserver, and end fast.

Each model instance runs in its own `triton_python_backend_stub` process, a child of tritonserver.
Every `model.py` calls `guard()` first thing in `initialize`:

- **No orphans.** A watcher thread exits the process as soon as its parent is gone (tritonserver was
  killed: the stub is re-parented). The stub's own check then calls the interpreter's teardown,
  which can hang for minutes with the engine's threads running; an orphan engine holds its memory
  (hundreds of MB) for ever.
- **Fast unload.** After `finalize`, the stub tears down the Python interpreter (a full garbage
  collection of torch and transformers): 8-10 s on a busy 2-core machine, per model, while
  tritonserver waits to exit. By then the model has answered the finalize request and released
  everything it owns, so an exit hook ends the process at once instead.

The engine's stub also bounds how long torch's OpenMP threads spin before they sleep
(`bound_openmp_spin`, before torch is imported: libgomp reads it when it loads). The stubs that only
tokenize load transformers without torch (`without_torch`).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time

PARENT_POLL_S = 0.5
# libgomp's spin-wait between parallel regions, in iterations (GOMP_SPINCOUNT; its default is 300000).
# A decode step is hundreds of short regions: workers that sleep between them pay a wake-up each
# (one SmolLM2 stream: 21.4 ms a token against 14.3 spinning, on a quiet 2-core machine), while an
# unbounded spin collapses when other processes take the cores (550 ms a token). 10000 keeps most of
# the gain (16.1 ms) and yields soon under load (docs/benchmarks.md, "Where one stream's token goes").
OPENMP_SPIN_COUNT = "10000"
_guarded = False


def _exit_now(code: int) -> None:
    logging.shutdown()  # flush the log handlers (stderr goes to tritonserver's log)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: S110 - a closed stream must not stop the exit
            pass
    os._exit(code)


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    print(f"tritonserver (pid {parent}) is gone: stub {os.getpid()} exits", file=sys.stderr)
    _exit_now(1)


def bound_openmp_spin() -> None:
    """Sets GOMP_SPINCOUNT (unless the environment sets it) for this process's OpenMP threads; call
    before torch is imported."""
    if "torch" in sys.modules:
        logging.getLogger(__name__).warning("torch is loaded already: GOMP_SPINCOUNT not set")
        return
    os.environ.setdefault("GOMP_SPINCOUNT", OPENMP_SPIN_COUNT)


def without_torch() -> None:
    """Hides torch from this process; call before transformers is imported, in a stub that only
    tokenizes (preprocessing, postprocessing).

    transformers imports torch whenever it is installed (its configuration utilities do), about
    340 MB of a tokenizer stub's 460 MB of RSS (docs/benchmarks.md, "Memory after the tokenizer
    stubs shed torch"). With torch absent it loads tokenizers, configurations and chat templates
    only, and picks the same tokenizer class: that choice never depends on torch
    (tests/serving/test_without_torch.py). A `None` entry in `sys.modules` makes `import torch`
    fail and `importlib.util.find_spec("torch")` (transformers' availability check) answer None.
    """
    if sys.modules.get("torch") is not None:
        logging.getLogger(__name__).warning("torch is loaded already: it stays")
        return
    sys.modules["torch"] = None  # type: ignore[assignment]
    # transformers then advises, once, that models are unavailable: true, and not this stub's job.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def guard() -> None:
    """Ties this stub's life to its tritonserver and skips the interpreter's teardown at exit."""
    global _guarded
    if _guarded:  # one per process
        return
    _guarded = True
    watcher = threading.Thread(target=_watch_parent, args=(os.getppid(),), name="stub-parent-watch")
    watcher.daemon = True
    watcher.start()
    # Exit handlers run at the start of the interpreter's teardown (after finalize was answered).
    atexit.register(_exit_now, 0)
