"""The bookkeeping of the inference replay (yolo_bimamba.nn.cuda_graph.run_eval) on CPU: which calls capture, which
replay, which run eagerly, and how many graphs and once-seen keys a layer keeps. The capture itself is replaced by a
stand-in that records its calls (it needs CUDA; tests/gpu/test_eval_graph.py runs the real one against the eager
layer)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from yolo_bimamba.nn import cuda_graph


class FakeGraph:
    made: list = []

    def __init__(self, forward, x):
        self.shape = tuple(x.shape)
        FakeGraph.made.append(self.shape)

    def __call__(self, x):
        return ("replay", tuple(x.shape))


@pytest.fixture()
def layer(monkeypatch):
    FakeGraph.made = []
    monkeypatch.setattr(cuda_graph, "_EvalGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # (no CUDA here)
    return nn.Linear(3, 3)


def call(layer, *shape):
    return cuda_graph.run_eval(layer, lambda x: ("eager", tuple(x.shape)), torch.zeros(*shape))


def test_a_key_is_captured_the_second_time_it_comes(layer):
    assert call(layer, 1, 2) == ("eager", (1, 2))
    assert FakeGraph.made == [] and cuda_graph.eval_graphed_shapes(layer) == []
    assert call(layer, 1, 2) == ("replay", (1, 2))
    assert call(layer, 1, 2) == ("replay", (1, 2))
    assert FakeGraph.made == [(1, 2)] and cuda_graph.eval_graphed_shapes(layer) == [(1, 2)]


def test_shapes_that_change_on_every_call_run_eagerly(layer):
    for h in range(1, 40):
        assert call(layer, 1, h) == ("eager", (1, h))
    assert FakeGraph.made == []
    table = cuda_graph._eval_graphs[layer]
    assert len(table) == cuda_graph.EVAL_MAX_SEEN  # the most recent keys seen once
    assert [k[0] for k in table] == [(1, h) for h in range(40 - cuda_graph.EVAL_MAX_SEEN, 40)]


def test_at_most_max_shapes_graphs_the_least_recently_used_dropped(layer):
    n = cuda_graph.MAX_SHAPES
    shapes = [(2, h) for h in range(1, n + 2)]
    for s in shapes:
        call(layer, *s)
        call(layer, *s)
    assert FakeGraph.made == shapes
    assert cuda_graph.eval_graphed_shapes(layer) == shapes[1:]
    assert call(layer, *shapes[1]) == ("replay", shapes[1])  # a replay makes it the most recent
    call(layer, 3, 3)
    call(layer, 3, 3)  # a new graph drops the least recently used: shapes[2]
    assert cuda_graph.eval_graphed_shapes(layer) == shapes[3:] + [shapes[1], (3, 3)]
    assert call(layer, *shapes[2]) == ("eager", shapes[2])  # dropped: seen once again, eager


def test_a_failed_capture_leaves_the_layer_eager(layer, monkeypatch, caplog):
    def fail(forward, x):
        raise RuntimeError("capture refused")

    monkeypatch.setattr(cuda_graph, "_EvalGraph", fail)
    call(layer, 1, 4)
    with caplog.at_level("WARNING", logger="yolo_bimamba"):
        assert call(layer, 1, 4) == ("eager", (1, 4))
    assert "capture refused" in caplog.text
    monkeypatch.setattr(cuda_graph, "_EvalGraph", FakeGraph)
    assert call(layer, 1, 4) == call(layer, 1, 4) == ("eager", (1, 4))
    assert FakeGraph.made == [] and cuda_graph._eval_graphs[layer] is None
