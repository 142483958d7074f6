"""Safe checkpoints: a checkpoint written by a real `model.train(...)` of a model with our blocks loads under
Ultralytics' restricted loading (ULTRALYTICS_SAFE_LOAD=1, the stock `yolo val` command) and under
torch.load(weights_only=True); a checkpoint that smuggles any other global (an os.system reduce, an unknown class, a
non-module object of ours) is refused, and nothing it names runs.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import yolo_bimamba  # noqa: F401  (registers the blocks and the safe globals)
from yolo_bimamba import guard
from yolo_bimamba.safe_load import module_classes, safe_globals, unpickling_hooks

REPO = Path(__file__).resolve().parents[1]
TINY_YAML = """\
nc: 1
backbone:
  - [-1, 1, Conv, [8, 3, 2]]
  - [-1, 1, Conv, [16, 3, 2]]
  - [-1, 1, Conv, [32, 3, 2]]
  - [-1, 1, C2fBiMamba, [32, True, 1, 0.5, {d_state: 8, headdim: 8, chunk_size: 16}]]
  - [-1, 1, Conv, [32, 3, 2]]
head:
  - [[3, 4], 1, Detect, [nc]]
"""


class _SystemCall:
    """Pickles as a call of os.system (what a malicious checkpoint holds)."""

    def __init__(self, cmd):
        self.cmd = cmd

    def __reduce__(self):
        return os.system, (self.cmd,)


class _UnknownModule(torch.nn.Module):
    """A module class nobody registered."""


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """best.pt of a 1-epoch CPU training run of a tiny model with a C2fBiMamba block, and three doctored copies."""
    from PIL import Image
    from ultralytics import YOLO

    root = tmp_path_factory.mktemp("safe_load")
    rng = np.random.default_rng(0)
    for sub in ("images", "labels"):
        (root / sub).mkdir()
    for k in range(4):
        img = (rng.random((64, 64, 3)) * 60).astype(np.uint8)
        img[10:30, 12:34] = [200, 50, 50]
        Image.fromarray(img).save(root / "images" / f"im{k}.png")
        (root / "labels" / f"im{k}.txt").write_text("0 0.3594 0.3125 0.3438 0.3125\n")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images\nval: images\nnames:\n  0: box\n")
    (root / "tiny.yaml").write_text(TINY_YAML)
    model = YOLO(str(root / "tiny.yaml"))
    model.train(data=str(root / "data.yaml"), epochs=1, imgsz=64, batch=2, workers=0, plots=False, device="cpu",
                project=str(root / "runs"), name="t", exist_ok=True, amp=False, verbose=False)
    best = Path(model.trainer.best)
    assert best.is_file()
    marker = root / "PWNED"
    good = torch.load(best, map_location="cpu", weights_only=False)  # our own file, just written
    bad = {}
    for kind in ("system", "unknown_class", "our_non_module"):
        ck = copy.deepcopy(good)
        if kind == "system":
            ck["extra"] = _SystemCall(f"touch {marker}")
        elif kind == "unknown_class":
            ck["model"].model[0].add_module("extra", _UnknownModule())
        else:
            ck["extra"] = guard.GuardState()
        bad[kind] = root / f"{kind}.pt"
        torch.save(ck, bad[kind])
    return dict(root=root, best=best, data=root / "data.yaml", marker=marker, bad=bad)


def _pickled_globals(path):
    """Every "module.name" a torch.save zip archive's pickle names (GLOBAL opcodes, torch's protocol 2)."""
    import pickletools
    import zipfile

    with zipfile.ZipFile(path) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    return {arg.replace(" ", ".") for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}


def test_safe_globals_are_our_module_classes_only(ckpts):
    classes = safe_globals()
    names = {f"{c.__module__}.{c.__qualname__}" for c in classes}
    assert {n.rsplit(".", 1)[1] for n in names} >= {"BiMamba2", "BiMambaLayer2D", "C2fBiMamba", "Hydra",
                                                      "HydraLayer2D", "C2fHydra", "RMSNormGated"}
    assert all(n.startswith("yolo_bimamba.nn.") and issubclass(c, torch.nn.Module) for n, c in zip(names, classes))
    assert {c: unpickling_hooks(c) for c in classes if unpickling_hooks(c)} == {}  # unpickling runs nn.Module's code
    assert classes == module_classes()  # none of our module classes is left off
    assert set(classes) <= set(torch.serialization.get_safe_globals())
    # everything of ours a real checkpoint names is on the list
    ours = {n for n in _pickled_globals(ckpts["best"]) if n.startswith("yolo_bimamba.")}
    assert ours and ours <= names
    # a class that customises unpickling is detected
    assert unpickling_hooks(_SystemCall) == ["_SystemCall.__reduce__"]


_CLI = r"""
import json, sys
from pathlib import Path
exec(compile(Path(sys.argv[1]).read_text(), "yolo_bimamba_autoload.pth", "exec"), {"__name__": "yolo_bimamba_autoload"})
from ultralytics.cfg import entrypoint  # what the stock `yolo` console script runs
import ultralytics.utils as uu
assert uu.SAFE_LOAD and "yolo_bimamba" in sys.modules
best, data, bad = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
common = ["imgsz=64", "batch=2", "device=cpu", "plots=False", "workers=0"]
sys.argv[:] = ["yolo", "val", f"model={best}", f"data={data}", *common]
entrypoint()  # raises if the checkpoint is refused
out = {"good": "validated"}
for kind, path in bad.items():
    sys.argv[:] = ["yolo", "val", f"model={path}", f"data={data}", *common]
    try:
        entrypoint()
        out[kind] = "loaded"
    except TypeError as e:
        out[kind] = str(e)
print("RESULT" + json.dumps(out))
"""


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(REPO), YOLO_OFFLINE="1", YOLO_AUTOINSTALL="0", **extra)
    return env


def test_ultralytics_safe_load_yolo_val(ckpts):
    """ULTRALYTICS_SAFE_LOAD=1 `yolo val model=best.pt` validates our checkpoint; the doctored ones are refused."""
    bad = {k: str(v) for k, v in ckpts["bad"].items()}
    r = subprocess.run([sys.executable, "-c", _CLI, str(REPO / "yolo_bimamba" / "_autoload.py"), str(ckpts["best"]),
                        str(ckpts["data"]), json.dumps(bad)], env=_env(ULTRALYTICS_SAFE_LOAD="1"),
                       cwd=ckpts["root"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][-1][len("RESULT"):])
    assert res.pop("good") == "validated" and "Speed:" in r.stdout + r.stderr  # the validation ran
    assert set(res) == set(bad)
    for kind, msg in res.items():
        assert "references types outside the supported" in msg, (kind, msg)
    assert not ckpts["marker"].exists()


def test_torch_load_weights_only(ckpts, tmp_path):
    """torch.load(weights_only=True): our classes load once yolo_bimamba is imported (and not before: the
    registration is what allows them). With the Ultralytics and torch.nn classes of best.pt allowed as well (as
    Ultralytics' restricted loading allows them), best.pt loads and each doctored copy is refused, naming its
    smuggled global."""
    from yolo_bimamba.nn import BiMamba2

    torch.manual_seed(0)
    mixer = BiMamba2(16, d_state=8, headdim=8, chunk_size=16).eval()
    path = tmp_path / "mixer.pt"
    torch.save(mixer, path)
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        torch.save(mixer(x), tmp_path / "ref.pt")
    torch.save(x, tmp_path / "x.pt")
    others = sorted(n for n in _pickled_globals(path) | _pickled_globals(ckpts["best"])
                    if n.startswith(("torch.nn.", "ultralytics.")))
    script = r"""
import importlib, json, pickle, sys, torch
path, xp, refp, best = sys.argv[1:5]
others, bad = json.loads(sys.argv[5]), json.loads(sys.argv[6])
allowed = [getattr(importlib.import_module(n.rsplit(".", 1)[0]), n.rsplit(".", 1)[1]) for n in others]
out = {}
with torch.serialization.safe_globals(allowed):
    try:
        torch.load(path, weights_only=True)
        out["before_import"] = "loaded"
    except pickle.UnpicklingError as e:
        out["before_import"] = str(e)
    assert "yolo_bimamba" not in sys.modules
    import yolo_bimamba  # noqa: F401
    m = torch.load(path, weights_only=True)
    with torch.no_grad():
        out["err"] = (m.eval()(torch.load(xp)) - torch.load(refp)).abs().max().item()
    out["best"] = type(torch.load(best, weights_only=True)["model"]).__name__
    for kind, p in bad.items():
        try:
            torch.load(p, weights_only=True)
            out[kind] = "loaded"
        except pickle.UnpicklingError as e:
            out[kind] = str(e)
print("RESULT" + json.dumps(out))
"""
    bad = {k: str(v) for k, v in ckpts["bad"].items()}
    r = subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "x.pt"), str(tmp_path / "ref.pt"),
                        str(ckpts["best"]), json.dumps(others), json.dumps(bad)],
                       env=_env(YOLO_BIMAMBA_AUTOLOAD="0"), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][-1][len("RESULT"):])
    assert "yolo_bimamba.nn.bimamba2.BiMamba2" in res["before_import"]
    assert res["err"] == 0.0 and res["best"] == "DetectionModel"
    assert "posix.system" in res["system"] or "os.system" in res["system"], res["system"]
    assert "_UnknownModule" in res["unknown_class"]
    assert "yolo_bimamba.guard.state.GuardState" in res["our_non_module"]
    assert not ckpts["marker"].exists()
