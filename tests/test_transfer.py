"""Starting from stock weights: stock-extension blocks keep the stock layer's weight names, the *-bimamba YAMLs keep
the stock layouts, Ultralytics' own transfer (YOLO(...).load(ckpt), the trainer's pretrained=) copies every stock
tensor, the model's outputs at step 0 equal the stock model's, and fine-tuning trains the new layers."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils._pytree import tree_leaves

import yolo_bimamba  # noqa: F401  (registers the blocks)
from yolo_bimamba import ultralytics_glue as glue

glue.register()

from ultralytics.nn.modules import C2PSA, SPPF, C2f, C3k2  # noqa: E402
from ultralytics.nn.tasks import DetectionModel, yaml_model_load  # noqa: E402

from yolo_bimamba.nn.extend import C2fPlusBiMamba, C2PSABiMamba, C3k2BiMamba, SPPFBiMamba  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# ours -> (stock YAML, indices of the extension blocks)
FAMILIES = {
    "yolo11-bimamba.yaml": ("yolo11.yaml", {10: "C2PSABiMamba", 22: "C3k2BiMamba"}),
    "yolo26-bimamba.yaml": ("yolo26.yaml", {10: "C2PSABiMamba", 22: "C3k2BiMamba"}),
    "yolov8-bimamba-sppf.yaml": ("yolov8.yaml", {9: "SPPFBiMamba", 21: "C2fPlusBiMamba"}),
    "yolov8-bimamba-sppf-p4.yaml": ("yolov8.yaml", {9: "SPPFBiMamba", 18: "C2fPlusBiMamba", 21: "C2fPlusBiMamba"}),
}
EXTENSIONS = [  # block, stock, stock args, input channels
    (SPPFBiMamba, SPPF, (32, 32, 5), 32),
    (SPPFBiMamba, SPPF, (32, 32, 5, 3, True), 32),
    (C2PSABiMamba, C2PSA, (64, 64, 1), 64),
    (C3k2BiMamba, C3k2, (48, 32, 1, True), 48),
    (C3k2BiMamba, C3k2, (32, 32, 1, True, 0.5, True), 32),
    (C2fPlusBiMamba, C2f, (48, 32, 2, True), 48),
]


def _perturb_bn(model: torch.nn.Module, seed: int = 0):
    """Move BatchNorm statistics and affine parameters away from their init (so an identity is not trivial)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
    return model


def _outputs(model, x):
    with torch.no_grad():
        return [t.float() for t in tree_leaves(model.eval()(x)) if isinstance(t, torch.Tensor)]


def _max_diff(a, b):
    assert len(a) == len(b) and len(a) > 0
    assert [t.shape for t in a] == [t.shape for t in b]
    return max((u - v).abs().max().item() for u, v in zip(a, b))


# --------------------------------------------------------------------------------------------------------- blocks
@pytest.mark.parametrize("cls,stock,args,c1", EXTENSIONS, ids=lambda v: getattr(v, "__name__", None))
def test_extension_block_is_the_stock_module_plus_an_identity_layer(cls, stock, args, c1):
    torch.manual_seed(0)
    layer = _perturb_bn(stock(*args)).eval()
    block = cls.from_stock(layer).eval()
    assert isinstance(block, stock) and type(block) is cls and cls.stock_name() == stock.__name__
    sd, sd_block = layer.state_dict(), block.state_dict()
    assert set(sd) < set(sd_block) and all(k.startswith("mix.") for k in set(sd_block) - set(sd))
    assert all(sd_block[k] is sd[k] or torch.equal(sd_block[k], sd[k]) for k in sd)
    assert "mix" not in layer._modules  # the stock layer itself is left as it was
    x = torch.randn(2, c1, 5, 6)
    with torch.no_grad():
        ref = layer(x)
        assert torch.equal(block(x), ref)  # layer_scale 0.0: exactly the stock output
        if hasattr(block, "forward_split"):  # what Ultralytics' exporter calls on every C2f
            assert torch.equal(block.forward_split(x), ref)
        block.mix.gamma.fill_(0.5)
        assert not torch.allclose(block(x), ref)
    # the constructor builds the same module (stock args positional or by name, layer kwargs by name)
    direct = cls(*args, scan="rowcol", d_state=16)
    assert set(direct.state_dict()) == set(sd_block) and direct.mix.scan == "rowcol"
    assert direct.mix.mixer.d_state == 16 and cls(*args).mix.gamma.abs().sum() == 0
    # every parameter, stock and new, gets a gradient once the scale is non-zero
    block.train()
    block(x).square().mean().backward()
    dead = [n for n, p in block.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not dead, dead
    assert block.mix.mixer.in_proj.weight.grad.abs().sum() > 0


def test_from_stock_rejects_other_modules():
    with pytest.raises(TypeError, match="SPPF"):
        SPPFBiMamba.from_stock(C2f(8, 8))
    with pytest.raises(TypeError, match="repeats"):
        SPPFBiMamba.from_stock(torch.nn.Sequential(SPPF(8, 8), SPPF(8, 8)))


# ---------------------------------------------------------------------------------------------------------- YAMLs
@pytest.mark.parametrize("ours", list(FAMILIES))
def test_yaml_is_the_stock_layout_with_extension_blocks(ours, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stock_yaml, blocks = FAMILIES[ours]
    d = yaml.safe_load((REPO / "cfg" / ours).read_text())
    s = yaml_model_load(stock_yaml)
    assert set(d["scales"]) == {"n", "s", "m"} and all(d["scales"][k] == s["scales"][k] for k in d["scales"])
    assert {k: d.get(k) for k in ("nc", "end2end", "reg_max")} == {k: s.get(k) for k in ("nc", "end2end", "reg_max")}
    rows, stock_rows = d["backbone"] + d["head"], s["backbone"] + s["head"]
    assert len(rows) == len(stock_rows)
    classes = glue.blocks()
    for i, (row, srow) in enumerate(zip(rows, stock_rows)):
        if i in blocks:
            assert row[2] == blocks[i] and classes[row[2]].stock_name() == srow[2]
            assert [row[0], row[1], row[3]] == [srow[0], srow[1], srow[3]]
        else:
            assert row == srow, (i, row, srow)


@pytest.mark.parametrize("scale", ["n", "s", "m"])
@pytest.mark.parametrize("ours", list(FAMILIES))
def test_every_stock_tensor_has_its_name_and_shape(ours, scale, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stock_yaml, blocks = FAMILIES[ours]
    name = ours.replace("-", f"{scale}-", 1) if ours.startswith("yolov8") else ours.replace("-", f"{scale}-", 1)
    m = DetectionModel(name, nc=7, verbose=False)
    ref = DetectionModel(stock_yaml.replace(".yaml", f"{scale}.yaml"), nc=7, verbose=False)
    sd, sd_ref = m.state_dict(), ref.state_dict()
    assert {k: v.shape for k, v in sd.items() if k in sd_ref} == {k: v.shape for k, v in sd_ref.items()}
    extra = {k.split(".")[1] for k in set(sd) - set(sd_ref)}
    assert extra == {str(i) for i in blocks} and all(".mix." in k for k in set(sd) - set(sd_ref))
    for i, bname in blocks.items():
        assert type(m.model[i]).__name__ == bname and m.model[i].type.endswith(bname)
        assert (m.model[i].i, m.model[i].f) == (ref.model[i].i, ref.model[i].f)
    assert type(m.model[-1]) is type(ref.model[-1]) and m.model[-1].legacy == ref.model[-1].legacy


def test_layer_table_shows_the_blocks():
    import ultralytics.nn.tasks as tasks

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    tasks.LOGGER.addHandler(handler)
    try:
        d = yaml_model_load("yolo11n-bimamba.yaml")
        d["backbone"][10][3] = [1024, {"d_state": 16}]
        model, _ = tasks.parse_model(d, ch=3, verbose=True)
    finally:
        tasks.LOGGER.removeHandler(handler)
    lines = {ln[:3].strip(): ln for ln in (r.getMessage() for r in records) if ln[:3].strip().isdigit()}
    assert "yolo_bimamba.nn.extend.C2PSABiMamba" in lines["10"] and "'d_state': 16" in lines["10"]
    assert f"{model[10].np:10d}" in lines["10"] and model[10].mix.mixer.d_state == 16
    assert "yolo_bimamba.nn.extend.C3k2BiMamba" in lines["22"] and "block.C3k2 " not in lines["22"]


# ------------------------------------------------------------------------------------------------------- transfer
def _nc_yaml(ours: str, nc: int, tmp_path: Path, scale: str = "n") -> str:
    """Our YAML with nc set (as the trainer sets it from the data), under a name that keeps the scale letter."""
    d = yaml.safe_load((REPO / "cfg" / ours).read_text())
    d["nc"] = nc
    stem = ours.replace(".yaml", "").replace("-", f"{scale}-", 1)
    path = tmp_path / f"{stem}-nc{nc}.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return str(path)


def _check_transfer(model, stock):
    """Every stock tensor is in ``model`` under its name with its value; only the new layers' tensors are extra."""
    sd, sd_stock = model.state_dict(), stock.state_dict()
    same = [k for k, v in sd_stock.items() if k in sd and sd[k].shape == v.shape and torch.equal(sd[k], v)]
    assert len(same) == len(sd_stock), sorted(set(sd_stock) - set(same))[:10]
    assert all(".mix." in k for k in set(sd) - set(sd_stock))
    return len(same), len(sd)


@pytest.mark.parametrize("ours", list(FAMILIES))
def test_python_load_transfers_a_stock_checkpoint(ours, tmp_path):
    """YOLO(<ours>.yaml).load(<stock .pt>): all stock tensors copied, outputs equal to the stock model's."""
    from ultralytics import YOLO

    stock_yaml = FAMILIES[ours][0].replace(".yaml", "n.yaml")
    torch.manual_seed(0)
    stock = _perturb_bn(DetectionModel(stock_yaml, nc=5, verbose=False))
    ckpt = tmp_path / "stock.pt"
    torch.save({"model": copy.deepcopy(stock).half(), "train_args": {}}, ckpt)
    stock = stock.half().float()  # the values the checkpoint holds
    model = YOLO(_nc_yaml(ours, 5, tmp_path)).load(str(ckpt))
    n, total = _check_transfer(model.model, stock)
    assert total - n == sum(len(model.model.model[i].mix.state_dict()) for i in FAMILIES[ours][1])
    x = torch.rand(2, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    assert _max_diff(_outputs(model.model, x), _outputs(stock, x)) == 0.0


@pytest.fixture(scope="module")
def trained_stock(tmp_path_factory):
    """yolo11n trained for one epoch on the tiny digits set: a real stock checkpoint (EMA, fp16)."""
    from ultralytics import YOLO

    root = tmp_path_factory.mktemp("stock")
    YOLO("yolo11n.yaml").train(data="digits-tiny.yaml", epochs=1, imgsz=64, batch=16, workers=0, device="cpu",
                               plots=False, val=False, project=str(root), name="run", exist_ok=True, verbose=False)
    ckpt = root / "run" / "weights" / "last.pt"
    assert ckpt.is_file()
    return ckpt


def test_trained_checkpoint_python_path(trained_stock, tmp_path):
    from ultralytics import YOLO

    stock = YOLO(str(trained_stock)).model.float().eval()
    model = YOLO(_nc_yaml("yolo11-bimamba.yaml", 10, tmp_path)).load(str(trained_stock))
    n, total = _check_transfer(model.model, stock)
    assert n == len(stock.state_dict()) and total > n
    x = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    assert _max_diff(_outputs(model.model, x), _outputs(stock, x)) == 0.0
    # the same count from yolo_bimamba.transfer_report, before loading and after
    from yolo_bimamba import transfer_report

    fresh = YOLO(_nc_yaml("yolo11-bimamba.yaml", 10, tmp_path))
    for target in (fresh, model.model):
        rep = transfer_report(target, str(trained_stock))
        assert rep["n_transferred"] == rep["n_checkpoint"] == n and rep["n_model"] == total
        assert rep["left_behind"] == [] and rep["new"] and all(".mix." in k for k in rep["new"])
    rep = transfer_report(fresh, {"model": DetectionModel("yolov8n.yaml", nc=10, verbose=False)})
    assert rep["n_transferred"] < rep["n_checkpoint"] and rep["left_behind"]  # another family: little transfers
    with pytest.raises(TypeError, match="ckpt"):
        transfer_report(fresh, {"optimizer": None})


def test_trained_checkpoint_trainer_path_and_fine_tune(trained_stock, tmp_path):
    """yolo train model=yolo11n-bimamba.yaml pretrained=<stock .pt>: every stock tensor transferred (Ultralytics'
    own count), the model the trainer starts from gives the stock outputs, the SSM parameters train without weight
    decay, and the fine-tune changes the new layers' weights."""
    from ultralytics import YOLO
    from ultralytics.utils import LOGGER

    from yolo_bimamba.recipe import no_decay_parameters

    stock = YOLO(str(trained_stock)).model.float().eval()
    x = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    ref = _outputs(stock, x)
    seen = {}

    def on_train_start(trainer):
        start = copy.deepcopy(trainer.model).float()
        seen["transfer"] = _check_transfer(start, stock)
        seen["diff"] = _max_diff(_outputs(start, x), ref)
        seen["start"] = {k: v.clone() for k, v in start.state_dict().items() if ".mix." in k}
        nd = {id(p) for p in no_decay_parameters(trainer.model).values()}
        seen["wd"] = [(g["weight_decay"], sum(id(p) in nd for p in g["params"]), len(g["params"]))
                      for g in trainer.optimizer.param_groups]

    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    LOGGER.addHandler(handler)
    model = YOLO("yolo11n-bimamba.yaml")
    model.add_callback("on_train_start", on_train_start)
    try:
        model.train(data="digits-tiny.yaml", pretrained=str(trained_stock), epochs=1, imgsz=64, batch=16, nbs=16,
                    workers=0, device="cpu", plots=False, val=False, project=str(tmp_path), name="ft", exist_ok=True,
                    optimizer="AdamW", lr0=0.01, weight_decay=0.05)
    finally:
        LOGGER.removeHandler(handler)
    n, total = seen["transfer"]
    assert n == len(stock.state_dict())
    assert any(f"Transferred {n}/{total} items" in r for r in records), [r for r in records if "Transferred" in r]
    assert seen["diff"] == 0.0
    # SSM parameters only in weight_decay=0 groups; decayed groups hold none of them
    assert sum(c for wd, c, _ in seen["wd"] if wd == 0) == len(no_decay_parameters(model.trainer.model)) > 0
    assert all(c == 0 for wd, c, _ in seen["wd"] if wd > 0) and any(wd > 0 for wd, _, _ in seen["wd"])
    # the fine-tune trained the new layers: the scales left zero and the mixers' weights moved
    end = model.trainer.model.state_dict()
    for i in FAMILIES["yolo11-bimamba.yaml"][1]:
        for name in ("mix.gamma", "mix.mixer.in_proj.weight", "mix.mixer.out_proj.weight"):
            k = f"model.{i}.{name}"
            assert not torch.equal(end[k].float(), seen["start"][k].float()), k
        assert end[f"model.{i}.mix.gamma"].abs().max() > 0
