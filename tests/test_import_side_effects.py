"""Importing yolo_bimamba (directly, after Ultralytics, or through the autoload hook) changes no environment variable,
no Ultralytics setting or online flag and writes no file; it adds only the guard's config keys and our module classes
to torch's weights_only allow-list. The offline fallbacks act only while Ultralytics is offline.

Each import order runs in a fresh process without YOLO_OFFLINE and with an empty Ultralytics config dir.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import yolo_bimamba  # noqa: F401
from yolo_bimamba import guard
from yolo_bimamba import ultralytics_glue as glue
from yolo_bimamba.safe_load import safe_globals

REPO = Path(__file__).resolve().parents[1]

_PROBE = r"""
import json, os, sys
from pathlib import Path

def snap():
    import torch
    import ultralytics.utils as uu
    cfg_dir = Path(os.environ["YOLO_CONFIG_DIR"])
    return dict(
        environ=dict(os.environ),
        settings=dict(uu.SETTINGS),
        online=uu.ONLINE,
        files=sorted(str(p.relative_to(cfg_dir)) for p in cfg_dir.rglob("*")),
        cfg_keys=sorted(uu.DEFAULT_CFG_DICT),
        safe=sorted(f"{g.__module__}.{g.__qualname__}" for g in torch.serialization.get_safe_globals()
                    if isinstance(g, type)),
    )

order = sys.argv[1]
out = {}
if order == "ultralytics-first":
    import torch, ultralytics  # noqa: F401
    out["before"] = snap()
    import yolo_bimamba  # noqa: F401
elif order == "package-first":
    import yolo_bimamba  # noqa: F401
elif order == "autoload":
    src = Path(sys.argv[2]).read_text()
    exec(compile(src, "yolo_bimamba_autoload.pth", "exec"), {"__name__": "yolo_bimamba_autoload"})
    import ultralytics  # noqa: F401  (the hook imports yolo_bimamba right after it)
    out["autoloaded"] = "yolo_bimamba" in sys.modules
out["after"] = snap()
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k not in ("YOLO_OFFLINE", "PYTHONPATH")}
    env["PYTHONPATH"] = str(REPO)
    out = {}
    for order in ("ultralytics-first", "package-first", "autoload"):
        cfg = tmp_path_factory.mktemp(f"cfg-{order}")
        # an installed .pth hook is active only in the "autoload" probe
        hook = "1" if order == "autoload" else "0"
        r = subprocess.run([sys.executable, "-c", _PROBE, order, str(REPO / "yolo_bimamba" / "_autoload.py")],
                           env={**env, "YOLO_CONFIG_DIR": str(cfg), "YOLO_BIMAMBA_AUTOLOAD": hook}, cwd=cfg,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][-1]
        res = json.loads(line[len("RESULT"):])
        for snap in [res["after"]] + ([res["before"]] if "before" in res else []):
            snap["environ"].pop("YOLO_CONFIG_DIR")  # differ per probe by construction
            snap["environ"].pop("YOLO_BIMAMBA_AUTOLOAD")
            snap["environ"].pop("PWD", None)
        out[order] = res
    return out


def test_import_after_ultralytics_changes_nothing_but_registrations(probes):
    before, after = probes["ultralytics-first"]["before"], probes["ultralytics-first"]["after"]
    assert "YOLO_OFFLINE" not in after["environ"]
    assert after["environ"] == before["environ"]
    assert after["settings"] == before["settings"] and after["online"] == before["online"]
    assert after["files"] == before["files"]  # no font or other file written into Ultralytics' config dir
    assert set(after["cfg_keys"]) - set(before["cfg_keys"]) == set(guard.GUARD_DEFAULTS)
    assert set(before["cfg_keys"]) <= set(after["cfg_keys"])
    ours = {f"{c.__module__}.{c.__qualname__}" for c in safe_globals()}
    added = set(after["safe"]) - set(before["safe"])
    # torch registers its own classes when submodules we import load (torch.distributed.tensor, torch._dynamo, ...)
    assert {g for g in added if not g.startswith("torch.")} == ours and set(before["safe"]) <= set(after["safe"])


@pytest.mark.parametrize("order", ["package-first", "autoload"])
def test_other_import_orders_leave_the_same_state(probes, order):
    res, ref = probes[order], probes["ultralytics-first"]["after"]
    if order == "autoload":
        assert res["autoloaded"]
    after = res["after"]
    assert "YOLO_OFFLINE" not in after["environ"]
    assert after["environ"] == ref["environ"]  # e.g. YOLO_OFFLINE is not set before Ultralytics reads it
    assert after["settings"] == ref["settings"] and after["online"] == ref["online"]
    assert after["files"] == ref["files"] and after["cfg_keys"] == ref["cfg_keys"] and after["safe"] == ref["safe"]


def test_offline_font_fallback_only_when_offline(tmp_path, monkeypatch):
    """Offline, a font missing from the config dir resolves to matplotlib's DejaVuSans without a download attempt and
    without writing a file; online, Ultralytics' own check_font runs."""
    import ultralytics.utils as uu

    calls = []

    def original(font="Arial.ttf"):
        calls.append(font)
        return "ultralytics-result"

    check_font = glue._wrap_check_font(original)
    monkeypatch.setattr(uu, "USER_CONFIG_DIR", tmp_path)
    # matplotlib may know an Arial.Unicode.ttf already (a training test's plots register the config dir's fonts): the
    # fallback is for a font it does not know, so the test starts from a font list without it
    from matplotlib import font_manager

    monkeypatch.setattr(font_manager.fontManager, "ttflist",
                        [f for f in font_manager.fontManager.ttflist if "Arial.Unicode.ttf" not in f.fname])
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    got = check_font("Arial.Unicode.ttf")
    assert Path(got).name == "DejaVuSans.ttf" and Path(got).is_file() and calls == []
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "Arial.Unicode.ttf").write_bytes(b"x")  # present locally: Ultralytics' check finds it
    assert check_font("Arial.Unicode.ttf") == "ultralytics-result" and calls == ["Arial.Unicode.ttf"]
    (tmp_path / "Arial.Unicode.ttf").unlink()
    monkeypatch.delenv("YOLO_OFFLINE")
    monkeypatch.setattr(uu, "ONLINE", True)
    assert check_font("Arial.Unicode.ttf") == "ultralytics-result" and calls == ["Arial.Unicode.ttf"] * 2
    # the registered wrapper is the one Ultralytics' plotting and dataset checks call
    import ultralytics.data.utils as du
    import ultralytics.utils.checks as checks

    assert checks.check_font._yolo_bimamba_original is not None and du.check_font is checks.check_font


def test_default_offline_only_for_our_entry_points(monkeypatch):
    """default_offline() (train.py, the yolo-bimamba CLI) sets YOLO_OFFLINE and Ultralytics' ONLINE flag, unless the
    user set YOLO_OFFLINE: then theirs stays."""
    import ultralytics.utils as uu
    import ultralytics.utils.checks as checks

    monkeypatch.setenv("YOLO_OFFLINE", "0")
    monkeypatch.setattr(uu, "ONLINE", True)
    monkeypatch.setattr(checks, "ONLINE", True)
    glue.default_offline()
    assert os.environ["YOLO_OFFLINE"] == "0" and uu.ONLINE is True
    monkeypatch.delenv("YOLO_OFFLINE")
    glue.default_offline()
    assert os.environ["YOLO_OFFLINE"] == "true" and uu.ONLINE is False and checks.ONLINE is False
