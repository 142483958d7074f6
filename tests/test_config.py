"""The configuration module (yolo_bimamba/config.py): every YOLO_BIMAMBA_* variable the package reads is parsed there,
listed in config.VARIABLES and in the README's table, with the same defaults."""
import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_config(env):
    """config.py loaded on its own (it is standard-library only) under the given environment."""
    old = dict(os.environ)
    os.environ.update(env)
    try:
        spec = importlib.util.spec_from_file_location("config_under_test", ROOT / "yolo_bimamba" / "config.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        os.environ.clear()
        os.environ.update(old)


def test_every_variable_the_package_names_is_in_the_table_and_the_readme():
    cfg = _load_config({})
    names = {v.name for v in cfg.VARIABLES}
    in_code = set()
    for path in (ROOT / "yolo_bimamba").rglob("*.py"):
        in_code |= set(re.findall(r"YOLO_BIMAMBA_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    assert in_code == names, (sorted(in_code - names), sorted(names - in_code))
    readme = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(YOLO_BIMAMBA_\w+)` \| `([^`]*)` \|", readme, re.M))
    assert rows == {v.name: v.default for v in cfg.VARIABLES}
    # only config.py (and the stdlib-only autoload hook) reads the environment for these variables
    readers = {p.name for p in (ROOT / "yolo_bimamba").rglob("*.py")
               if re.search(r"environ[^\n]*YOLO_BIMAMBA_", p.read_text())}
    assert readers == {"config.py", "_autoload.py"}, readers


def test_variables_are_parsed_at_import_and_at_call(monkeypatch):
    cfg = _load_config({"YOLO_BIMAMBA_AUTOTUNE": "0", "YOLO_BIMAMBA_PROGRAMS_PER_SM": "3.5",
                        "YOLO_BIMAMBA_SPLIT_DIRECTIONS": " No ", "YOLO_BIMAMBA_ORDERED_ROWS": "TRUE",
                        "YOLO_BIMAMBA_DIRECT_LAUNCH": "", "YOLO_BIMAMBA_FP16_SCAN": "FP16"})
    assert cfg.AUTOTUNE is False and cfg.PROGRAMS_PER_SM == 3.5 and cfg.split_directions_off()
    assert cfg.ORDERED_ROWS is True and cfg.DIRECT_LAUNCH is False and cfg.FP16_SCAN == "fp16"
    monkeypatch.delenv("YOLO_BIMAMBA_SPLIT_DIRECTIONS", raising=False)
    monkeypatch.delenv("YOLO_BIMAMBA_FUSED_CONV", raising=False)
    defaults = _load_config({})
    assert defaults.SPLIT_DIRECTIONS == "auto" and not defaults.split_directions_off()
    assert defaults.fused_conv()
    monkeypatch.setenv("YOLO_BIMAMBA_FUSED_CONV", "0")  # read at each call
    assert not defaults.fused_conv() and defaults.fused_norm()
    with pytest.raises(ValueError, match="YOLO_BIMAMBA_FP16_SCAN must be 'bf16' or 'fp16', got 'fp8'"):
        _load_config({"YOLO_BIMAMBA_FP16_SCAN": "fp8"})


def test_inference_replay_is_on_by_default_and_each_switch_turns_it_off(monkeypatch):
    for name in ("YOLO_BIMAMBA_EVAL_GRAPHS", "YOLO_BIMAMBA_CUDA_GRAPHS"):
        monkeypatch.delenv(name, raising=False)
    cfg = _load_config({})
    assert cfg.eval_graphs() and cfg.cuda_graphs()
    monkeypatch.setenv("YOLO_BIMAMBA_EVAL_GRAPHS", "0")
    assert not cfg.eval_graphs() and cfg.cuda_graphs()
    monkeypatch.setenv("YOLO_BIMAMBA_EVAL_GRAPHS", "1")
    monkeypatch.setenv("YOLO_BIMAMBA_CUDA_GRAPHS", "0")
    assert not cfg.eval_graphs() and not cfg.cuda_graphs()


def test_inference_replay_limit_is_read_at_each_call_and_checked(monkeypatch):
    monkeypatch.delenv("YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL", raising=False)
    cfg = _load_config({})
    assert cfg.eval_graph_max_numel() == 1 << 20
    monkeypatch.setenv("YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL", " 16777216 ")
    assert cfg.eval_graph_max_numel() == 1 << 24
    for bad in ("-1", "2^20", "1e6", ""):
        monkeypatch.setenv("YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL", bad)
        with pytest.raises(ValueError, match="YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL must be a whole number"):
            cfg.eval_graph_max_numel()
