"""The pure-Python parts of benchmarks/bench_train.py (the GPU measurements themselves run on the device machine):
which runs a model gets for --cuda-graphs, the environment switch around a run, and the alternating loop rounds."""
from __future__ import annotations

import os

import pytest

import benchmark_script  # tests/benchmark_script.py

bench_train = benchmark_script.load("bench_train")


def test_runs_of_gives_both_settings_to_bimamba_models_only():
    assert bench_train.runs_of("yolov8n-bimamba-p5.yaml", "both") == ("1", "0")
    assert bench_train.runs_of("yolov8n-hydra.yaml", "off") == ("0",)
    assert bench_train.runs_of("yolov8n.yaml", "both") == (None,)


@pytest.mark.parametrize("before", [None, "1"])
def test_graphs_env_sets_and_restores(monkeypatch, before):
    if before is None:
        monkeypatch.delenv("YOLO_BIMAMBA_CUDA_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", before)
    with bench_train.graphs_env("0"):
        assert os.environ["YOLO_BIMAMBA_CUDA_GRAPHS"] == "0"
    assert os.environ.get("YOLO_BIMAMBA_CUDA_GRAPHS") == before
    with bench_train.graphs_env(None):
        assert os.environ.get("YOLO_BIMAMBA_CUDA_GRAPHS") == before


def test_loop_rounds_alternate_the_order_and_report_the_median_round():
    calls = []
    speed = {("a", "1"): [100.0, 300.0, 200.0], ("a", "0"): [50.0, 70.0, 60.0]}

    def bench(run):
        calls.append(run)
        return {"loop_epoch_s": [1.0], "loop_images_per_s": speed[run][sum(c == run for c in calls) - 1]}

    res = bench_train.loop_rounds([("a", "1"), ("a", "0")], 3, bench)
    assert calls == [("a", "1"), ("a", "0"), ("a", "0"), ("a", "1"), ("a", "1"), ("a", "0")]
    assert res[("a", "1")]["loop_images_per_s"] == 200.0 and res[("a", "0")]["loop_images_per_s"] == 60.0
    assert res[("a", "1")]["loop_images_per_s_rounds"] == [100.0, 300.0, 200.0]


def test_loop_rounds_keep_going_past_a_failed_run_and_report_after_each_run():
    calls, seen = [], []

    def bench(run):
        calls.append(run)
        if run == "b" and calls.count("b") == 1:
            raise RuntimeError("loop bench failed for b: pin memory thread died")
        return {"loop_epoch_s": [2.0], "loop_images_per_s": 100.0 * len(calls)}

    res = bench_train.loop_rounds(["a", "b", "c"], 2, bench, on_run=lambda partial: seen.append(partial))
    assert calls == ["a", "b", "c", "c", "b", "a"]  # the failure did not stop the round or the next one
    assert res["b"]["loop_failures"] == ["round 0: RuntimeError: loop bench failed for b: pin memory thread died"]
    assert res["b"]["loop_images_per_s_rounds"] == [500.0] and res["b"]["loop_images_per_s"] == 500.0
    assert "loop_failures" not in res["a"] and res["a"]["loop_images_per_s_rounds"] == [100.0, 600.0]
    assert len(seen) == 6  # one report per run, each with what was measured so far
    assert seen[0] == {"a": {"loop_epoch_s": [2.0], "loop_images_per_s_rounds": [100.0], "loop_images_per_s": 100.0},
                       "b": {}, "c": {}}
    assert seen[1]["b"] == {"loop_failures": res["b"]["loop_failures"]}
    assert seen[-1] == res
