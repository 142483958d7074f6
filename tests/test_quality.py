"""The detection-quality benchmark (benchmarks/quality.py) end to end on CPU, its FLOPs counter, and the study YAMLs.

The end-to-end test trains 2 models x 2 seeds for 1 epoch at 64 px on the tiny digits set (about 100 s on a 2-core
CPU, most of it the six subprocesses' imports), then checks the JSON, the table and the plot, and that a second call
with a budget adds nothing it cannot finish and keeps every entry.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import yolo_bimamba  # noqa: F401
from yolo_bimamba.flops import mixer_macs, model_gflops, ssd_macs
from yolo_bimamba.nn.bimamba2 import BiMamba2
from yolo_bimamba.nn.blocks import BiMambaLayer2D
from yolo_bimamba.nn.hydra import Hydra

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


# ------------------------------------------------------------------------------------------------ FLOPs counter
def test_ssd_macs_by_hand():
    # L 100 in chunks of 64 and 36: sum of squared chunk lengths 4096 + 1296 = 5392; H 4, P 16, N 16, G 1
    assert ssd_macs(1, 100, 4, 16, 16, 1, 64) == 5392 * 16 + 5392 * 64 + 4 * 100 * 4 * 16 * 16 + 2 * 2 * 4 * 16 * 16 + 100 * 64
    assert ssd_macs(3, 100, 4, 16, 16, 1, 64) == 3 * ssd_macs(1, 100, 4, 16, 16, 1, 64)


def test_mixer_macs_hand_computed():
    torch.manual_seed(0)
    m = BiMamba2(32, d_state=16, headdim=16, expand=2, d_conv=7, chunk_size=64)  # d_inner 64, 4 heads, conv_dim 96
    x = torch.randn(1, 100, 32)
    # conv 100*96*7 = 67200; scores 5392*16 = 86272; values 5392*64 = 345088; states 4*100*4*16*16 = 409600;
    # passing 2*2*4*16*16 = 4096; D skip 100*64 = 6400
    assert mixer_macs(m, x) == 918656
    h = Hydra(32, d_state=16, headdim=16, expand=2, d_conv=7, chunk_size=64)  # conv_dim 128, B/C per direction
    # conv 89600; scores 2*86272; values 345088; states 409600; passing 4096; skip 6400; fc_D 100*64*4 = 25600
    assert mixer_macs(h, x) == 1052928
    with pytest.raises(TypeError, match="BiMamba2 or Hydra"):
        mixer_macs(torch.nn.Linear(2, 2), x)


def test_mixer_rule_adds_to_the_projections_in_thop():
    import thop

    from yolo_bimamba import flops

    m = BiMamba2(32, d_state=16, headdim=16, expand=2, d_conv=7, chunk_size=64)
    macs = thop.profile(m, inputs=[torch.randn(1, 100, 32)], custom_ops={BiMamba2: flops._rule}, verbose=False)[0]
    # in_proj 100*32*(2*64 + 2*16 + 4) = 524800 and out_proj 100*64*32 = 204800 by thop's nn.Linear rule, the rest ours
    assert macs == 524800 + 204800 + 918656


def test_model_gflops_plain_model_matches_ultralytics():
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import get_flops

    m = DetectionModel("yolov8n.yaml", nc=80, verbose=False)
    ours, theirs = model_gflops(m, 640), get_flops(m, 640)
    assert theirs > 8 and math.isclose(ours, theirs, rel_tol=1e-9)


def test_model_gflops_counts_each_mixer_once():
    """A model's count with the mixer rule = its count with the mixers' work removed + the rule's work of each
    mixer call (the P5 mixer of the p5 model at 320 px sees one 10x10 map: L = 100)."""
    from ultralytics.nn.tasks import DetectionModel

    from yolo_bimamba import flops

    m = DetectionModel("yolov8n-bimamba-p5.yaml", nc=80, verbose=False)
    mixers = [mod for mod in m.modules() if isinstance(mod, BiMamba2)]
    assert len(mixers) == 1
    x = torch.zeros(1, 100, mixers[0].d_model)
    real = flops._rule
    try:
        flops._rule = lambda mod, inputs, output: None  # the same profile without the mixers' own work
        without = model_gflops(m, 320)
    finally:
        flops._rule = real
    assert math.isclose(model_gflops(m, 320), without + 2 * mixer_macs(mixers[0], x) / 1e9, rel_tol=1e-12)


# ------------------------------------------------------------------------------------------------------ YAMLs
STUDY = sorted((REPO / "cfg" / "study").glob("*.yaml"))
#: study variants that extend a stock model and must start as it: file name part -> the stock YAML
STUDY_STOCK = {"yolov8-bimamba-sppf-": "yolov8n.yaml", "yolo11-bimamba-": "yolo11n.yaml"}


def study_name(path) -> str:
    """The name quality.py runs a study file by: cfg/study/yolo11-x.yaml -> study/yolo11n-x.yaml (scale n)."""
    return "study/" + re.sub(r"^(yolov8|yolo11|yolo26)-", r"\1n-", path.name)


@pytest.mark.parametrize("path", [p for p in STUDY if "NEEDS" not in p.read_text()], ids=lambda p: p.stem)
def test_study_yaml_builds_and_runs(path):
    from quality import model_path
    from ultralytics.nn.tasks import DetectionModel

    text = path.read_text()
    assert text.startswith("# Design study - "), "each study YAML says what it tests in its header"
    m = DetectionModel(model_path(study_name(path)), nc=10, verbose=False).eval()
    assert any(isinstance(mod, BiMambaLayer2D) for mod in m.modules())
    with torch.no_grad():
        y = m(torch.rand(1, 3, 64, 64))[0]
    assert torch.isfinite(y).all()


STOCK_STUDY = [(p, stock) for p in STUDY for part, stock in STUDY_STOCK.items() if p.name.startswith(part)]


def test_stock_study_variants_are_found():
    assert {stock for _, stock in STOCK_STUDY} == set(STUDY_STOCK.values())


@pytest.mark.parametrize("path,stock", STOCK_STUDY, ids=lambda v: getattr(v, "stem", v))
def test_extending_variants_keep_the_stock_model_and_start_as_it(path, stock):
    """The variants of bimamba.yaml's and yolo11-bimamba.yaml's designs keep their stock model's layers (names,
    shapes) and start as it."""
    from quality import model_path
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    ref = DetectionModel(stock, nc=10, verbose=False).eval()
    m = DetectionModel(model_path(study_name(path)), nc=10, verbose=False).eval()
    sd, sd_ref = m.state_dict(), ref.state_dict()
    assert {k: v.shape for k, v in sd.items() if k in sd_ref} == {k: v.shape for k, v in sd_ref.items()}
    assert all(".mix." in k for k in set(sd) - set(sd_ref))
    m.load_state_dict(sd_ref, strict=False)
    x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(m(x)[0], ref(x)[0])


def test_default_grid_names_existing_models():
    import quality

    for cfg in quality.GRID_DEFAULTS["models"]:
        if "/" in cfg:
            assert (REPO / "cfg" / cfg.replace("yolov8n-", "yolov8-")).is_file(), cfg


def test_grid_yaml_and_flags(tmp_path):
    import quality

    grid = tmp_path / "grid.yaml"
    grid.write_text("epochs: 5\nmodels: [yolov8n.yaml, study/yolov8n-bimamba-p45.yaml]\nseeds: [3, 4, 5]\n")
    g = quality._grid(quality.parser().parse_args(["run", "--grid", str(grid), "--epochs", "7", "--datasets", "digits",
                                                   "--cache", "False"]))
    assert g["epochs"] == 7 and g["seeds"] == [3, 4, 5] and g["datasets"] == ["digits"] and g["cache"] is False
    js = quality.jobs(g)
    assert len(js) == 2 * 3 and js[0]["key"] == "scratch|yolov8n|digits|3" and js[1]["model"].startswith("study/")
    assert js[0]["recipe"] == js[1]["recipe"] and js[0]["recipe"]["imgsz"] == 256 and js[0]["recipe"]["fliplr"] == 0.0
    bad = tmp_path / "bad.yaml"
    bad.write_text("epoch: 5\n")
    with pytest.raises(SystemExit, match="unknown grid key"):
        quality._grid(quality.parser().parse_args(["run", "--grid", str(bad)]))


def test_recipe_variants_name_their_runs_and_set_their_environment(tmp_path, monkeypatch):
    """A model named NAME.yaml@VARIANT trains NAME.yaml with the variant's environment (here: the SSM parameters
    under weight decay, which yolo_bimamba.recipe then reads as off), under its own key, paired with NAME."""
    import quality
    from quality_report import stock_of

    from yolo_bimamba import recipe as R

    variant = "study/yolov8n-bimamba-p45.yaml@ssm-decay"
    g = quality._grid(quality.parser().parse_args(["run", "--models", "yolov8n.yaml", variant, "--datasets", "digits",
                                                   "--seeds", "0"]))
    keys = [j["key"] for j in quality.jobs(g)]
    assert keys == ["scratch|yolov8n|digits|0", "scratch|yolov8n-bimamba-p45@ssm-decay|digits|0"]
    assert quality.model_path(variant) == str(REPO / "cfg" / "study" / "yolov8n-bimamba-p45.yaml")
    assert stock_of("yolov8n-bimamba-p45@ssm-decay") == "yolov8n-bimamba-p45"
    with pytest.raises(ValueError, match=r"unknown recipe variant 'lr2'.*ssm-decay"):
        quality.jobs({**g, "models": ["bimamba.yaml@lr2"]})
    env = quality.run_env({"model": "bimamba.yaml@ssm-decay", "data_dir": str(tmp_path)})
    assert env["YOLO_BIMAMBA_CACHE"] == str(tmp_path)
    assert "YOLO_BIMAMBA_SSM_NO_DECAY" not in quality.run_env({"model": "bimamba.yaml", "data_dir": str(tmp_path)})
    # the report: the variant's row shows its network's speed entry and its pair is the default-recipe model
    from quality_report import paired_deltas, table

    runs = {f"scratch|{m}|digits|0": {"key": f"scratch|{m}|digits|0", "mode": "scratch", "dataset": "digits",
                                      "seed": 0, "status": "ok", "mAP50": v, "mAP50_95": v, "recipe": {"epochs": 1}}
            for m, v in (("x-bimamba", 0.50), ("x-bimamba@ssm-decay", 0.47))}
    doc = {"runs": runs, "speed": {"x-bimamba|gpu": {"model": "x-bimamba", "gpu": "gpu", "status": "ok",
                                                      "latency_b1_ms": 4.25, "params": 3e6}}}
    (d,) = paired_deltas(doc)
    assert d["model"] == "x-bimamba@ssm-decay" and d["stock"] == "x-bimamba" and d["deltas"] == pytest.approx([-3.0])
    assert "| digits | x-bimamba@ssm-decay | 1 | 0.470 ± 0.000 | 0.470 ± 0.000 | 3.00 | - | 4.25 |" in table(doc)
    monkeypatch.delenv("YOLO_BIMAMBA_SSM_NO_DECAY", raising=False)
    assert R.enabled()
    for k, v in quality.RECIPE_VARIANTS["ssm-decay"].items():
        assert env[k] == v
        monkeypatch.setenv(k, v)
    assert not R.enabled()


# ---------------------------------------------------------------------------------------------- end to end
def _quality(*args, timeout=900):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               YOLO_OFFLINE="1", YOLO_AUTOINSTALL="0")
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "quality.py"), *args], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return r.stdout


@pytest.mark.slow  # whole benchmark runs (tens of seconds); .ci/run runs the slow tier
def test_quality_end_to_end_cpu(tmp_path):
    models = ["yolov8n.yaml", "yolov8n-bimamba-p5.yaml"]
    common = ["--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--runs-dir", str(tmp_path / "runs"),
              "--models", *models, "--datasets", "digits-tiny", "--epochs", "1", "--imgsz", "64", "--batch", "16",
              "--workers", "0", "--device", "cpu", "--cache", "False", "--latency-imgsz", "64"]
    out = _quality("run", *common, "--seeds", "0", "1", "--parallel", "2")
    assert "4 run(s) to do" in out
    doc = json.loads((tmp_path / "out" / "quality.json").read_text())
    runs = doc["runs"]
    assert sorted(runs) == sorted(f"scratch|{m[:-5]}|digits-tiny|{s}" for m in models for s in (0, 1))
    recipes = {json.dumps(r["recipe"], sort_keys=True) for r in runs.values()}
    assert len(recipes) == 1, "every model trains with the same recipe"
    for r in runs.values():
        assert r["status"] == "ok", r
        assert 0.0 <= r["mAP50_95"] <= r["mAP50"] <= 1.0 and r["train_s"] > 0 and r["n_train"] == 48
        assert 0.0 <= r["test_mAP50_95"] <= r["test_mAP50"] <= 1.0  # digits-tiny has a test split
        assert r["recipe"]["epochs"] == 1 and r["recipe"]["imgsz"] == 64 and r["recipe"]["optimizer"] == "AdamW"
    speed = {s["model"]: s for s in doc["speed"].values()}
    assert sorted(speed) == ["yolov8n", "yolov8n-bimamba-p5"]
    for s in speed.values():
        assert s["status"] == "ok" and s["params"] > 3e6 and s["latency_b1_ms"] > 0
    assert speed["yolov8n"]["gflops"] == speed["yolov8n"]["gflops_thop_only"]  # no mixer: the same count
    assert speed["yolov8n-bimamba-p5"]["gflops"] > speed["yolov8n"]["gflops"]
    assert doc["calls"][-1]["grid"]["seeds"] == [0, 1] and doc["calls"][-1]["commit"]

    md = (tmp_path / "out" / "quality.md").read_text()
    for m in ("yolov8n", "yolov8n-bimamba-p5"):
        assert f"| digits-tiny | {m} | 2 |" in md
    assert "mAP50-95" in md and "GFLOPs" in md and "| test mAP50-95 |" in md
    assert "paired by seed (val split)" in md and "paired by seed (test split)" in md
    from PIL import Image

    with Image.open(tmp_path / "out" / "quality.png") as im:
        assert im.size[0] > 300 and im.size[1] > 200

    # a second call: a third seed, but a budget of 1 s: no run fits (expected length from the first call's runs),
    # nothing is launched, every entry stays, and the runs left for later are recorded
    out = _quality("run", *common, "--seeds", "0", "1", "2", "--budget-s", "1", "--no-speed")
    assert "2 run(s) to do" in out and "left for a later call" in out
    doc2 = json.loads((tmp_path / "out" / "quality.json").read_text())
    assert doc2["runs"] == runs and len(doc2["calls"]) == 2
    assert sorted(doc2["calls"][-1]["left_for_later"]) == sorted(f"scratch|{m[:-5]}|digits-tiny|2" for m in models)


@pytest.mark.slow  # whole benchmark runs (tens of seconds); .ci/run runs the slow tier
def test_quality_finetune_cpu(tmp_path):
    """--mode finetune: a stock model trained briefly is the checkpoint; the stock model and the BiMamba2 model are
    fine-tuned from it with the same recipe, and the JSON says how many tensors each took over."""
    _quality("run", "--mode", "finetune", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out"),
             "--runs-dir", str(tmp_path / "runs"), "--datasets", "digits-tiny", "--pretrain-data", "digits-tiny",
             "--pretrain-epochs", "1", "--finetune-pairs", "yolov8n.yaml:yolov8n-bimamba-p5.yaml", "--seeds", "0",
             "--epochs", "1", "--imgsz", "64", "--batch", "16", "--parallel", "2", "--workers", "0", "--device", "cpu",
             "--cache", "False", "--no-speed")
    runs = json.loads((tmp_path / "out" / "quality.json").read_text())["runs"]
    pre = runs["pretrain|yolov8n|digits-tiny|0"]
    assert pre["status"] == "ok" and Path(pre["checkpoint"]).is_file()
    stock = runs["finetune|yolov8n<-yolov8n|digits-tiny|0"]
    ours = runs["finetune|yolov8n-bimamba-p5<-yolov8n|digits-tiny|0"]
    assert stock["status"] == ours["status"] == "ok" and stock["recipe"] == ours["recipe"]
    assert stock["transferred"][0] == stock["transferred"][1] > 300  # every tensor of the same architecture
    assert 0 < ours["transferred"][0] < ours["transferred"][1]
    assert "### finetune" in (tmp_path / "out" / "quality.md").read_text()


def test_report_pareto_front():
    from quality_report import pareto

    pts = [(1.0, 0.50, "a"), (2.0, 0.60, "b"), (2.5, 0.55, "c"), (3.0, 0.70, "d"), (1.5, 0.40, "e")]
    assert pareto(pts) == ["a", "b", "d"]


def test_report_pairs_each_model_with_its_stock_model_by_seed():
    from quality_report import paired_deltas, stock_of, table

    assert stock_of("yolo11n-bimamba") == "yolo11n" and stock_of("yolov8n-bimamba-sppf") == "yolov8n"
    assert stock_of("study/yolov8n-bimamba-p45") == "yolov8n" and stock_of("yolov8n") is None
    assert stock_of("yolov8n-hydra") == "yolov8n" and stock_of("yolo26n") is None
    assert stock_of("bimamba") == "yolov8n" and stock_of("bimamba@ssm-decay") == "bimamba"  # bimamba.yaml is a YOLOv8n
    rec = {"epochs": 30}

    def run(model, seed, m, status="ok", recipe=rec):
        return {"key": f"scratch|{model}|digits|{seed}", "mode": "scratch", "dataset": "digits", "seed": seed,
                "status": status, "mAP50_95": m, "mAP50": m, "recipe": recipe}

    runs = [run("yolov8n", 0, 0.50), run("yolov8n", 1, 0.60), run("yolov8n", 2, 0.40),
            run("yolov8n-bimamba-sppf", 0, 0.52), run("yolov8n-bimamba-sppf", 1, 0.59),
            run("yolov8n-bimamba-sppf", 2, 0.0, status="failed"),  # not paired
            run("yolov8n-bimamba", 0, 0.55, recipe={"epochs": 5})]  # another recipe: not paired
    doc = {"runs": {r["key"] + str(i): r for i, r in enumerate(runs)}}
    (d,) = paired_deltas(doc)
    assert d["model"] == "yolov8n-bimamba-sppf" and d["stock"] == "yolov8n" and d["seeds"] == [0, 1]
    assert d["deltas"] == pytest.approx([2.0, -1.0]) and d["mean"] == pytest.approx(0.5) and d["wins"] == 1
    assert "| digits | yolov8n-bimamba-sppf | yolov8n | 2 | +2.0, -1.0 | +0.5 ± 2.1 | 1 of 2 |" in table(doc)
    assert paired_deltas(doc, "test_mAP50_95") == [] and "test split" not in table(doc)
    # test-split figures, where runs have them, are paired the same way and reported in their own section
    for r, t in zip(runs, (0.40, 0.50, 0.30, 0.43, 0.49)):
        r["test_mAP50_95"] = t
    (d,) = paired_deltas(doc, "test_mAP50_95")
    assert d["deltas"] == pytest.approx([3.0, -1.0]) and d["wins"] == 1
    md = table(doc)
    assert "| digits | yolov8n-bimamba-sppf | yolov8n | 2 | +3.0, -1.0 | +1.0 ± 2.8 | 1 of 2 |" in md
    assert "paired by seed (test split)" in md and "| test mAP50-95 |" in md and "0.400 ± 0.100" in md


def test_report_pairs_a_fine_tuned_model_with_its_stock_model_from_the_same_checkpoint():
    from quality_report import paired_deltas, table

    def run(label, mode, seed, m):
        return {"key": f"{mode}|{label}|digits|{seed}", "mode": mode, "dataset": "digits", "seed": seed, "status": "ok",
                "mAP50_95": m, "mAP50": m, "recipe": {"epochs": 30}}

    runs = [run("yolo11n<-yolo11n", "finetune", 0, 0.80), run("yolo11n-bimamba<-yolo11n", "finetune", 0, 0.83),
            run("yolo11n<-yolo11n", "finetune", 1, 0.90), run("yolo11n-bimamba<-yolo11n", "finetune", 1, 0.89),
            run("yolo11n", "scratch", 0, 0.50),  # another mode: never the pair of a fine-tuned run
            run("yolo11n-bimamba<-yolov8n", "finetune", 0, 0.99)]  # another checkpoint: no pair
    doc = {"runs": {r["key"]: r for r in runs}}
    (d,) = paired_deltas(doc)
    assert d["model"] == "yolo11n-bimamba<-yolo11n" and d["stock"] == "yolo11n<-yolo11n" and d["seeds"] == [0, 1]
    assert d["deltas"] == pytest.approx([3.0, -1.0]) and d["wins"] == 1
    row = "| digits | yolo11n-bimamba<-yolo11n | yolo11n<-yolo11n | 2 | +3.0, -1.0 | +1.0 ± 2.8 | 1 of 2 |"
    assert row in table(doc)


def test_speed_only_in_a_new_runs_dir(tmp_path):
    """--speed-only builds no dataset and makes its own log folder (it once failed in a runs dir not made yet)."""
    import quality

    out, runs = tmp_path / "out", tmp_path / "new" / "runs"
    quality.main(["run", "--speed-only", "--out", str(out), "--runs-dir", str(runs), "--data-dir",
                  str(tmp_path / "no-data"), "--device", "cpu", "--models", "yolov8n.yaml", "--datasets", "digits"])
    speed = json.loads((out / "quality.json").read_text())["speed"]
    (entry,) = speed.values()
    assert entry["status"] == "ok" and entry["model"] == "yolov8n" and entry["latency_b1_ms"] > 0
    assert (runs / "logs" / "speed_yolov8n.log").is_file() and not (tmp_path / "no-data").exists()
