"""Triton adapter for the in-flight batching engine (decoupled); the work is in
tritonlm.serving.engine_service: `execute` hands the requests over and returns at once."""

from __future__ import annotations

import logging

from tritonlm.serving import stub_process

stub_process.bound_openmp_spin()  # before torch loads

from tritonlm.serving.engine_service import EngineService  # noqa: E402

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        stub_process.guard()  # ends with tritonserver, and ends fast
        self.service = EngineService(args)

    def execute(self, requests: list) -> None:
        self.service.submit(requests)

    def finalize(self) -> None:
        self.service.stop()
