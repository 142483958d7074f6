"""Every ``YOLO_BIMAMBA_*`` environment variable, parsed in this one module.

Most are read once, when ``yolo_bimamba`` is imported: the constants below (set the variables before the import;
tests and benchmarks may assign the constants, which the package reads at each use). Some are read at each call
(the functions below), so a running process may change them. :data:`VARIABLES` lists them all, as the README's
table "Environment variables" does.

``YOLO_BIMAMBA_AUTOLOAD`` is read by ``yolo_bimamba/_autoload.py`` alone: that file is embedded into a ``.pth`` file
and runs at interpreter start, before the package exists, so it stays standard-library only and self-contained.
``TRITON_INTERPRET`` is Triton's own variable; :func:`triton_interpret` reads it where the kernel modules are imported.
"""
from __future__ import annotations

import os
from typing import NamedTuple


class Variable(NamedTuple):
    name: str
    default: str
    read: str  # "import" or "each call"
    meaning: str


VARIABLES = (
    Variable("YOLO_BIMAMBA_AUTOTUNE", "1", "import",
             "0: no autotuning; the default configs run (saves the compile of every config on first use)"),
    Variable("YOLO_BIMAMBA_PROGRAMS_PER_SM", "2", "import",
             "backward programs per SM the sequence is cut into segments for"),
    Variable("YOLO_BIMAMBA_FWD_PAIRS_PER_SM", "4", "import",
             "programs per SM the forward's in-chunk pairs kernel keeps before it walks several heads per program"),
    Variable("YOLO_BIMAMBA_SPLIT_DIRECTIONS", "auto", "import",
             "1 / 0: the backward's two directions in two launches / one; auto: one for BiMamba2 blocks up to "
             "headdim and d_state 64, two otherwise"),
    Variable("YOLO_BIMAMBA_ORDERED_ROWS", "0", "import",
             "1: ngroups < nheads sums dB, dC over a group's heads inside the backward kernel, in head order (less "
             "memory, more GPU time)"),
    Variable("YOLO_BIMAMBA_DIRECT_LAUNCH", "1", "import",
             "0: every kernel launch through Triton's launch path (by default a compiled kernel is launched directly "
             "after its first launch)"),
    Variable("YOLO_BIMAMBA_CHECK_LAUNCH", "0", "import",
             "1: each direct launch is checked against Triton's own specialisation (the GPU tests)"),
    Variable("YOLO_BIMAMBA_FP16_SCAN", "bf16", "import",
             "fp16: under fp16 AMP the mixers' scans stay fp16; bf16: the Triton kernels get bf16 x, B, C on GPUs "
             "with bf16 tensor cores"),
    Variable("YOLO_BIMAMBA_POISON", "0", "import",
             "1: every kernel output and gradient buffer starts NaN-filled inside NaN guard regions (a test hook)"),
    Variable("YOLO_BIMAMBA_CUDA_GRAPHS", "1", "each call",
             "0: no CUDA-graph replay of the layers in CUDA training (nor in inference)"),
    Variable("YOLO_BIMAMBA_EVAL_GRAPHS", "1", "each call",
             "0: no replay of the layers' captured forward graphs in CUDA inference (by default each layer replays "
             "one for inputs of at most YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL elements)"),
    Variable("YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL", "1048576", "each call",
             "the largest input (elements) a layer replays as a graph in CUDA inference; larger inputs run eagerly. "
             "Each graph keeps its forward's memory, which grows with the input"),
    Variable("YOLO_BIMAMBA_FUSED_CONV", "1", "each call",
             "0: the blocks' depthwise conv1d + SiLU as PyTorch ops instead of Triton kernels on CUDA"),
    Variable("YOLO_BIMAMBA_FUSED_NORM", "1", "each call",
             "0: the gated RMSNorm and the token LayerNorm as PyTorch ops instead of Triton kernels on CUDA"),
    Variable("YOLO_BIMAMBA_SSM_NO_DECAY", "1", "each call",
             "0: the trainer groups our mixers' A_log, D, dt_bias, norm weights and layer scales as Ultralytics "
             "groups any weight (with weight decay) instead of without it"),
    Variable("YOLO_BIMAMBA_CACHE", "$XDG_CACHE_HOME/yolo-bimamba", "each call",
             "directory of the generated datasets (default ~/.cache/yolo-bimamba without XDG_CACHE_HOME)"),
    Variable("YOLO_BIMAMBA_FASHION_MNIST", "/usr/share/datasets/fashion-mnist", "each call",
             "folder of the Fashion-MNIST idx files the fashion scenes are built from (Debian's "
             "dataset-fashion-mnist installs them there)"),
    Variable("YOLO_BIMAMBA_AUTOLOAD", "1", "interpreter start",
             "0: the .pth import hook does not register the blocks when Ultralytics is imported"),
)

_OFF = ("", "0", "false", "no")


def _default(name: str) -> str:
    return next(v.default for v in VARIABLES if v.name == name)


def _get(name: str) -> str:
    return os.environ.get(name, _default(name))


def _on(name: str) -> bool:  # "" and "0" are off
    return _get(name) not in ("", "0")


# ---------------------------------------------------------------- read at import
AUTOTUNE: bool = _on("YOLO_BIMAMBA_AUTOTUNE")
PROGRAMS_PER_SM: float = float(_get("YOLO_BIMAMBA_PROGRAMS_PER_SM"))
FWD_PAIRS_PER_SM: float = float(_get("YOLO_BIMAMBA_FWD_PAIRS_PER_SM"))
SPLIT_DIRECTIONS: str = _get("YOLO_BIMAMBA_SPLIT_DIRECTIONS").strip().lower()  # "auto", or off (_OFF) / on
ORDERED_ROWS: bool = _get("YOLO_BIMAMBA_ORDERED_ROWS").strip().lower() not in _OFF
DIRECT_LAUNCH: bool = _on("YOLO_BIMAMBA_DIRECT_LAUNCH")
CHECK_LAUNCH: bool = _on("YOLO_BIMAMBA_CHECK_LAUNCH")
FP16_SCAN: str = _get("YOLO_BIMAMBA_FP16_SCAN").strip().lower()
if FP16_SCAN not in ("bf16", "fp16"):
    raise ValueError(f"YOLO_BIMAMBA_FP16_SCAN must be 'bf16' or 'fp16', got {FP16_SCAN!r}")
POISON: bool = _on("YOLO_BIMAMBA_POISON")


def split_directions_off() -> bool:
    """SPLIT_DIRECTIONS reads as "never two launches"."""
    return SPLIT_DIRECTIONS in _OFF


# ---------------------------------------------------------------- read at each call
def cuda_graphs() -> bool:
    return _get("YOLO_BIMAMBA_CUDA_GRAPHS") != "0"


def eval_graphs() -> bool:
    return _get("YOLO_BIMAMBA_EVAL_GRAPHS") != "0" and cuda_graphs()


def eval_graph_max_numel() -> int:
    raw = _get("YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL").strip()
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"YOLO_BIMAMBA_EVAL_GRAPH_MAX_NUMEL must be a whole number of elements >= 0, got {raw!r}")
    return value


def fused_conv() -> bool:
    return _get("YOLO_BIMAMBA_FUSED_CONV") != "0"


def fused_norm() -> bool:
    return _get("YOLO_BIMAMBA_FUSED_NORM") != "0"


def ssm_no_decay() -> bool:
    return _get("YOLO_BIMAMBA_SSM_NO_DECAY").strip() != "0"


def fashion_mnist_dir() -> str:
    """YOLO_BIMAMBA_FASHION_MNIST where set and not empty, else the default (Debian's install folder)."""
    return os.environ.get("YOLO_BIMAMBA_FASHION_MNIST") or _default("YOLO_BIMAMBA_FASHION_MNIST")


def cache_dir() -> str | None:
    """YOLO_BIMAMBA_CACHE where set and not empty, else None (data.cache_root then uses XDG_CACHE_HOME)."""
    return os.environ.get("YOLO_BIMAMBA_CACHE") or None


def triton_interpret() -> bool:
    """Triton's TRITON_INTERPRET (CPU tensors through Triton's interpreter), read where a kernel module is imported."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
