"""CPU tests of yolo_bimamba.inference: where graph replays are not possible the eager forward runs, unchanged, and
leaving the block leaves nothing on the model. (The replay itself needs CUDA: tests/gpu/test_gpu_inference_graph.py.)"""
import pickle

import pytest
import torch
from torch import nn

from yolo_bimamba import graph_inference
from yolo_bimamba.inference import GraphedForward, _plain_call


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, augment=False):
        return self.lin(x) * (2 if augment else 1)


def test_cpu_calls_run_the_eager_forward_and_leave_nothing_behind():
    net = Net().eval()
    x = torch.randn(5, 4)
    want = net(x)
    with torch.no_grad(), graph_inference(net) as g:
        assert isinstance(net.forward, GraphedForward)
        assert torch.equal(net(x), want)
        assert torch.equal(net(x, augment=True), 2 * want)
        assert not g.graphs and not g.failed
    assert "forward" not in vars(net)
    pickle.loads(pickle.dumps(net))  # nothing unpicklable is left on the module


def test_nested_blocks_and_bad_models_are_refused():
    net = Net()
    with graph_inference(net):
        with pytest.raises(RuntimeError, match="already overridden"):
            with graph_inference(net):
                pass
    with pytest.raises(TypeError, match="nn.Module"):
        with graph_inference(object()):
            pass


def test_an_ultralytics_model_installs_on_the_detection_model(tmp_path):
    from ultralytics import YOLO

    yolo = YOLO("yolov8n-bimamba-p5.yaml")
    with graph_inference(yolo):
        assert isinstance(vars(yolo.model)["forward"], GraphedForward)
        assert "forward" not in vars(yolo)
    assert "forward" not in vars(yolo.model)


def test_only_plain_prediction_calls_are_replayed():
    assert _plain_call((), {})
    assert _plain_call((), {"augment": False, "visualize": False, "embed": None})
    assert not _plain_call((), {"augment": True})
    assert not _plain_call((), {"embed": [1, 2]})
    assert not _plain_call((), {"profile": True})
    assert not _plain_call((True,), {})
