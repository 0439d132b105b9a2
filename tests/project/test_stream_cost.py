"""client.stream_cost's own arithmetic (the servers it drives are the e2e tests')."""

import pytest

from client.stream_cost import OTHERS, Sample, environment, report, tpot_ms


def test_variants_are_environment_assignments():
    assert environment("") == {}
    assert environment("TRITONLM_CPU_THREADS=1, OMP_WAIT_POLICY=passive") == {
        "TRITONLM_CPU_THREADS": "1",
        "OMP_WAIT_POLICY": "passive",
    }
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        environment("TRITONLM_CPU_THREADS")


def test_tpot_counts_the_gaps_after_the_first_token():
    assert tpot_ms([1.0]) is None
    assert tpot_ms([1.0, 1.02, 1.06]) == pytest.approx(30.0)


def test_report_takes_medians_over_rounds():
    rounds = [
        Sample(64, [30.0], [20.0], 31.0, {"stub:engine": 25.0, OTHERS: 5.0}),
        Sample(64, [40.0], [22.0], 41.0, {"stub:engine": 27.0, OTHERS: 9.0}),
        Sample(64, [50.0], [24.0], 51.0, {"stub:engine": 29.0, OTHERS: 1.0}),
    ]
    text = report({"engine": rounds})
    assert "client TPOT   40.00 ms" in text
    assert "engine gap   41.00 ms" in text
    assert "engine step   22.00 ms" in text
    assert "ours 27.00" in text  # the rest of the machine is not ours
