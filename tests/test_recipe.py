"""The SSM training recipe: our mixers' A_log, D, dt_bias, norm weights and layer scales train in the weight_decay=0
weight group; every other parameter is grouped as Ultralytics groups it; stock models get Ultralytics' optimizer."""

from __future__ import annotations

import pytest
import torch

import yolo_bimamba  # noqa: F401  (registers the blocks and the recipe)
from yolo_bimamba import ultralytics_glue as glue

glue.register()

from ultralytics.engine.trainer import BaseTrainer  # noqa: E402
from ultralytics.nn.tasks import DetectionModel  # noqa: E402

from yolo_bimamba.recipe import apply_no_decay, no_decay_parameters  # noqa: E402


class _Args:
    lr0 = 0.01


def _build(model, name, original=False):
    """BaseTrainer.build_optimizer (ours, or Ultralytics' own) on a bare trainer object."""
    trainer = BaseTrainer.__new__(BaseTrainer)
    trainer.args, trainer.data = _Args(), {"nc": 10}
    fn = BaseTrainer.build_optimizer._yolo_bimamba_original if original else BaseTrainer.build_optimizer
    return fn(trainer, model, name=name, lr=0.01, momentum=0.9, decay=5e-4, iterations=10)


def _groups(opt, names):
    """name -> (weight_decay, lr, param_group) of every parameter in the optimizer."""
    out = {}
    for g in opt.param_groups:
        for p in g["params"]:
            assert id(p) not in out, "a parameter in two groups"
            out[names[id(p)]] = (g["weight_decay"], g["lr"], g.get("param_group"), g.get("use_muon", False))
    return out


def test_build_optimizer_is_wrapped_once():
    assert hasattr(BaseTrainer.build_optimizer, "_yolo_bimamba_original")
    assert not hasattr(BaseTrainer.build_optimizer._yolo_bimamba_original, "_yolo_bimamba_original")


@pytest.mark.parametrize("name", ["SGD", "AdamW", "MuSGD"])
@pytest.mark.parametrize("cfg", ["yolo11n-bimamba.yaml", "yolov8n-bimamba.yaml", "yolov8n-hydra.yaml"])
def test_ssm_parameters_train_without_weight_decay(cfg, name):
    torch.manual_seed(0)
    model = DetectionModel(cfg, nc=10, verbose=False)
    names = {id(p): n for n, p in model.named_parameters()}
    ours, stock = _groups(_build(model, name), names), _groups(_build(model, name, original=True), names)
    assert set(ours) == set(stock) == set(names.values())  # every parameter once, none lost
    nd = no_decay_parameters(model)
    leaf = {n.split(".")[-1] for n in nd}
    assert {"A_log", "D", "dt_bias", "weight"} <= leaf
    assert any(".mixer.norm.weight" in n for n in nd)  # the gated RMSNorm weights
    if cfg.startswith("yolo11"):
        assert any(n.endswith("mix.gamma") for n in nd)
    for n, (wd, lr, group, muon) in ours.items():
        if n in nd:  # no decay, and not among the biases (whose warmup starts at warmup_bias_lr)
            assert wd == 0.0 and group == "bn" and lr == stock[n][1] and not muon, (n, ours[n], stock[n])
        else:
            assert ours[n] == stock[n], (n, ours[n], stock[n])  # everything else as Ultralytics grouped it
    moved = [n for n in nd if stock[n][0] > 0 or stock[n][2] == "bias"]
    assert moved and all(n.split(".")[-1] in {"A_log", "D", "dt_bias", "weight", "gamma"} for n in moved)
    assert any(n.endswith("dt_bias") for n in moved)  # Ultralytics counts it among the biases


def test_stock_model_optimizer_unchanged():
    model = DetectionModel("yolo11n.yaml", nc=10, verbose=False)
    assert no_decay_parameters(model) == {}
    names = {id(p): n for n, p in model.named_parameters()}
    a, b = _build(model, "SGD"), _build(model, "SGD", original=True)
    assert _groups(a, names) == _groups(b, names) and len(a.param_groups) == len(b.param_groups)


def test_old_pickled_parameters_without_marks_are_found_by_name():
    model = DetectionModel("yolov8n-bimamba-sppf.yaml", nc=10, verbose=False)
    for p in model.parameters():
        p.__dict__.pop("_no_weight_decay", None)
    nd = no_decay_parameters(model)
    assert {n.split(".")[-1] for n in nd} >= {"A_log", "D", "dt_bias", "gamma", "weight"}


def test_apply_no_decay_refuses_a_stepped_optimizer():
    model = DetectionModel("yolov8n-bimamba-sppf.yaml", nc=10, verbose=False)
    opt = _build(model, "SGD", original=True)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    with pytest.raises(RuntimeError, match="stepped"):
        apply_no_decay(opt, model)


def test_recipe_can_be_turned_off(monkeypatch):
    model = DetectionModel("yolov8n-bimamba-sppf.yaml", nc=10, verbose=False)
    names = {id(p): n for n, p in model.named_parameters()}
    monkeypatch.setenv("YOLO_BIMAMBA_SSM_NO_DECAY", "0")
    assert _groups(_build(model, "SGD"), names) == _groups(_build(model, "SGD", original=True), names)
    monkeypatch.setenv("YOLO_BIMAMBA_SSM_NO_DECAY", "1")
    assert _groups(_build(model, "SGD"), names) != _groups(_build(model, "SGD", original=True), names)
