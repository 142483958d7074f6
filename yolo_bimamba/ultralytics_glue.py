"""Registration of the yolo-bimamba blocks with Ultralytics, without forking it.

:func:`register` (idempotent, called by ``import yolo_bimamba``):

* **YAML rows.** Ultralytics' ``parse_model`` decides which modules get ``c1`` inferred, ``c2`` width-scaled and
  capped by ``max_channels`` and ``n`` depth-scaled from sets that are local to the function and rebuilt on every
  call, so no registry can extend them. :func:`parse_model` wraps the original instead: rows naming one of our
  blocks are rewritten to a built-in module (trailing dict arguments are taken out as the block's keyword
  arguments), the original builds the model, and each such layer is then turned into our block. Blocks of the C2f
  signature (``C2fBiMamba``, ``C2fHydra``) are rewritten to ``C2f`` and rebuilt from the channels the original
  resolved for it (``c1`` = cv1 input, ``c2`` = cv2 output, ``n`` = number of bottlenecks). Blocks that extend a
  stock module (:mod:`yolo_bimamba.nn.extend`: ``SPPFBiMamba``, ``C3k2BiMamba``, ...) are rewritten to the module
  they name (``stock_name()``) and made from the built layer itself (``from_stock``), which keeps its submodules
  and their names, so stock checkpoints transfer. Either way the block scales exactly like the stock module in every
  Ultralytics version, whatever the shape of those sets. The layer table that ``parse_model`` logs is corrected to
  show our block, its parameter count and its arguments.
* **Names.** Our blocks are also put into ``ultralytics.nn.tasks``' globals.
* **YAML lookup.** ``ultralytics.utils.checks.check_file`` (behind ``check_yaml`` and ``check_det_dataset``) is
  wrapped so that bare names of our YAMLs (``bimamba.yaml``, ``yolov8-bimamba.yaml`` - hence ``yolov8n-bimamba.yaml``
  through Ultralytics' scale-letter stripping -, ``digits.yaml``, ...) resolve from any directory, and so that a
  dataset descriptor YAML (``yolo_bimamba_dataset:`` key, see :mod:`yolo_bimamba.data`) is built on first use and
  replaced by the generated data YAML.
* **Offline fallbacks**, active only while Ultralytics is offline (``YOLO_OFFLINE`` set, or no network when
  Ultralytics was imported), so they change nothing for an online user: a font Ultralytics would download
  (Arial.ttf, Arial.Unicode.ttf) and cannot find locally is replaced by matplotlib's DejaVuSans (nothing is written
  to disk); the CUDA AMP check, which downloads a reference model, is skipped when that model is not on disk (AMP
  stays on, which is what Ultralytics itself does when the download fails). This module never sets ``YOLO_OFFLINE``:
  only our own entry points default to offline (:func:`default_offline`: ``train.py``, the ``yolo-bimamba`` CLI; the
  tests and CI set it themselves).
* **Recipe.** The trainer's optimizer keeps our mixers' A_log, D, dt_bias, norm weights and layer scales out of
  weight decay (:mod:`yolo_bimamba.recipe`; models without our blocks are unaffected).
* **Guard.** ``yolo_bimamba.guard.install()``: the guard's config keys and ``BaseTrainer`` patches, which run
  Ultralytics' own methods unchanged unless the guard is active (a model with our blocks, or ``nan_guard=True``).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import logging
import os
import sys
import threading
from pathlib import Path

__all__ = ["register", "register_block", "blocks", "cfg_dir", "resolve_name", "parse_model", "default_offline"]

#: Block names looked up lazily in yolo_bimamba.nn (a block that does not exist yet is simply not registered).
_KNOWN_BLOCKS = ("C2fBiMamba", "C2fHydra", "SPPFBiMamba", "C2PSABiMamba", "C3k2BiMamba", "C2fPlusBiMamba")
_EXTRA_BLOCKS: dict[str, type] = {}
_LOCK = threading.RLock()
_REGISTERED = False
_C2F_TYPE = "ultralytics.nn.modules.block.C2f"
_TRUTHY = {"1", "true", "yes", "on", "y", "t"}


def cfg_dir() -> Path:
    """Directory holding our YAMLs: the copy installed inside the package, else the repository's top-level cfg/."""
    here = Path(__file__).resolve().parent
    packaged = here / "cfg"
    return packaged if packaged.is_dir() else here.parent / "cfg"


def register_block(cls: type, name: str | None = None) -> type:
    """Make ``cls`` usable in YAML rows: a C2f-signature block ``(c1, c2, n, shortcut, g, e, **kw)`` like C2f, or a
    block with ``stock_name()`` and ``from_stock(layer, **kw)`` (see :mod:`yolo_bimamba.nn.extend`) like its stock
    module."""
    name = name or cls.__name__
    _EXTRA_BLOCKS[name] = cls
    if _REGISTERED:
        import ultralytics.nn.tasks as tasks

        setattr(tasks, name, cls)
    return cls


def blocks() -> dict[str, type]:
    """Name -> class of every block handled by the parse_model wrapper."""
    out = {}
    nn_mod = importlib.import_module("yolo_bimamba.nn")
    for name in _KNOWN_BLOCKS:
        cls = getattr(nn_mod, name, None)
        if cls is None:
            # e.g. C2fHydra lives in yolo_bimamba.nn.hydra and may not be re-exported by yolo_bimamba.nn
            with contextlib.suppress(ImportError):
                cls = getattr(importlib.import_module("yolo_bimamba.nn.hydra"), name, None)
        if cls is not None:
            out[name] = cls
    out.update(_EXTRA_BLOCKS)
    return out


# ----------------------------------------------------------------------------------------------------- parse_model
def _literal(v):
    if isinstance(v, str):
        with contextlib.suppress(ValueError, SyntaxError):
            return ast.literal_eval(v)
    return v


class _Capture(logging.Filter):
    """Holds back the records logged while the original parse_model runs, so the layer table can be corrected."""

    def __init__(self):
        super().__init__()
        self.records = []

    def filter(self, record):
        self.records.append(record)
        return False


def _type_name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _fix_line(msg: str, layer, cls, stock_type: str, args) -> str:
    """The layer-table line of the stock module ``stock_type`` rewritten for our block: its type, parameter count and
    ``args`` (a list, or a function of the stock line's argument text)."""
    k = msg.find(stock_type)
    if k < 0:
        return msg
    if callable(args):
        args = args(msg[k + len(stock_type):].strip())
    head = msg[:k].rstrip()
    head = head[: len(head) - len(head.split()[-1])].rstrip()  # drop the stock module's parameter count
    return f"{head}{layer.np:10.0f}  {_type_name(cls):<45}{args!s:<30}"


def _with_kwargs(kw: dict, args_text: str) -> str:
    return f"{args_text[:-1]}, {kw}]" if kw and args_text.endswith("]") else args_text


def _extends_stock(cls) -> bool:
    return callable(getattr(cls, "from_stock", None)) and callable(getattr(cls, "stock_name", None))


def _from_stock(cls, layer, kw):
    """A layer built by Ultralytics as the stock module, made into our block ``cls`` (same submodules)."""
    block = cls.from_stock(layer, **kw)
    block.np = sum(p.numel() for p in block.parameters())
    block.i, block.f, block.type = layer.i, layer.f, _type_name(cls)
    return block


def _apply_recorded_swap(model, save, d):
    """A model saved after ``swap_hydra`` records the swap in its YAML dict: Ultralytics rebuilds models from the
    YAML (training from a .pt), so the rebuilt layers are swapped the same way and the saved weights fit."""
    from .swap import apply_yaml_swap

    apply_yaml_swap(model, d)
    return model, save


def _make_wrapper(original):
    @functools.wraps(original)
    def parse_model(d, ch, verbose=True):
        ours = blocks()
        rows = list(d.get("backbone") or []) + list(d.get("head") or [])
        if not any(isinstance(r[2], str) and r[2] in ours for r in rows):
            return _apply_recorded_swap(*original(d, ch, verbose), d)

        d = dict(d)
        specs = {}  # layer index -> (class, row args without kwargs, kwargs, stock module name)
        i = 0
        for sec in ("backbone", "head"):
            new_rows = []
            for f, n, m, args in d.get(sec) or []:
                args = list(args)
                if isinstance(m, str) and m in ours:
                    cls, kw = ours[m], {}
                    while args and isinstance(args[-1], dict):
                        kw = {**args.pop(), **kw}
                    if not args:
                        raise ValueError(f"layer {i} ({m}): the first argument must be the output channels c2")
                    stock = cls.stock_name() if _extends_stock(cls) else "C2f"
                    if not _extends_stock(cls) and len(args) > 4:
                        raise ValueError(f"layer {i} ({m}): expected args [c2, shortcut, g, e, {{kwargs}}], got {args}")
                    specs[i] = (cls, list(args), kw, stock)
                    m = stock
                new_rows.append([f, n, m, args])
                i += 1
            d[sec] = new_rows

        from ultralytics.nn.tasks import LOGGER

        cap = _Capture()
        if verbose:
            LOGGER.addFilter(cap)
        try:
            model, save = original(d, ch, verbose)
        finally:
            if verbose:
                LOGGER.removeFilter(cap)

        logs, stock_types = {}, {}
        for i, (cls, args, kw, stock) in specs.items():
            if _extends_stock(cls):
                stock_types[i] = _type_name(type(model[i]))
                model[i] = _from_stock(cls, model[i], kw)
                logs[i] = functools.partial(_with_kwargs, kw)  # the stock line's arguments, then the kwargs
                continue
            stock_types[i] = _C2F_TYPE
            c2f = model[i]
            c1, c2, n = c2f.cv1.conv.in_channels, c2f.cv2.conv.out_channels, len(c2f.m)
            shortcut = bool(_literal(args[1])) if len(args) > 1 else False
            g = int(_literal(args[2])) if len(args) > 2 else 1
            e = float(_literal(args[3])) if len(args) > 3 else 0.5
            if int(c2 * e) != c2f.c:
                raise RuntimeError(f"layer {i}: could not recover C2f's expansion (c={c2f.c}, c2={c2}, e={e})")
            block = cls(c1, c2, n, shortcut, g, e, **kw)
            block.np = sum(p.numel() for p in block.parameters())
            block.i, block.f, block.type = c2f.i, c2f.f, f"{cls.__module__}.{cls.__qualname__}"
            model[i] = block
            logs[i] = [c1, c2, n, shortcut, g, e, *([kw] if kw else [])]

        for rec in cap.records:
            msg = rec.getMessage()
            head = msg[:3].strip()
            if head.isdigit() and int(head) in logs and stock_types[int(head)] in msg:
                i = int(head)
                rec.msg, rec.args = _fix_line(msg, model[i], specs[i][0], stock_types[i], logs[i]), ()
            LOGGER.handle(rec)
        return _apply_recorded_swap(model, save, d)

    parse_model._yolo_bimamba_original = original
    return parse_model


def parse_model(d, ch, verbose=True):
    """Ultralytics' parse_model with our blocks handled like C2f (available after :func:`register`)."""
    import ultralytics.nn.tasks as tasks

    register()
    return tasks.parse_model(d, ch, verbose)


# ---------------------------------------------------------------------------------------------------- YAML lookup
def resolve_name(file) -> str | None:
    """Path for a bare YAML name of ours (model or dataset), building a dataset on first use; else None."""
    if not isinstance(file, (str, Path)):
        return None
    s = str(file).strip()
    if not s or "://" in s or os.path.exists(s) or Path(s).name != s:
        return None
    from .data import resolve_data_yaml

    cand = cfg_dir() / s
    if cand.is_file():
        return resolve_data_yaml(cand) or str(cand)
    if not Path(s).suffix:  # bare dataset name (data=digits), as Ultralytics 8.4 allows for its own datasets
        cand = cfg_dir() / f"{s}.yaml"
        if cand.is_file():
            return resolve_data_yaml(cand)  # None (no match) unless it is one of our dataset descriptors
    return None


def _wrap_check_file(original):
    @functools.wraps(original)
    def check_file(file, *args, **kwargs):
        ours = resolve_name(file)
        if ours is not None:
            return ours
        out = original(file, *args, **kwargs)
        if isinstance(out, (str, Path)) and str(out).endswith((".yaml", ".yml")):
            from .data import resolve_data_yaml

            built = resolve_data_yaml(out)
            if built is not None:
                return built
        return out

    check_file._yolo_bimamba_original = original
    return check_file


def _rebind(name: str, old, new):
    """Replace ``old`` by ``new`` under ``name`` in every loaded ultralytics module (from-imports copy the name)."""
    for mod_name, mod in list(sys.modules.items()):
        if mod is not None and (mod_name == "ultralytics" or mod_name.startswith("ultralytics.")):
            if getattr(mod, name, None) is old:
                setattr(mod, name, new)


# ---------------------------------------------------------------------------------------------- offline fallbacks
def _wrap_check_font(original):
    """Offline only: a font that is neither in Ultralytics' config dir nor a known system font is not downloaded;
    matplotlib's DejaVuSans stands in (online, or when the font is there, Ultralytics' own check runs)."""

    @functools.wraps(original)
    def check_font(font="Arial.ttf"):
        if _offline():
            from ultralytics.utils import USER_CONFIG_DIR

            name = Path(font).name
            if not (USER_CONFIG_DIR / name).exists():
                with contextlib.suppress(ImportError):
                    from matplotlib import font_manager

                    if not any(font in f.fname and os.path.exists(f.fname) for f in font_manager.fontManager.ttflist):
                        import matplotlib

                        src = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
                        if src.is_file():
                            return src
        return original(font)

    check_font._yolo_bimamba_original = original
    return check_font


def default_offline() -> None:
    """For our own entry points only (train.py, the ``yolo-bimamba`` CLI): this process is offline unless the user
    set ``YOLO_OFFLINE`` (then theirs is kept). Sets the variable and, if Ultralytics is already imported, its
    ``ONLINE`` flag in every module that imported it."""
    if os.environ.get("YOLO_OFFLINE") is not None:
        return
    os.environ["YOLO_OFFLINE"] = "true"  # Ultralytics 8.3 only recognises the spelling "true"
    if "ultralytics.utils" in sys.modules:
        _rebind("ONLINE", True, False)


def _offline() -> bool:
    import ultralytics.utils as uu

    return not getattr(uu, "ONLINE", True) or os.environ.get("YOLO_OFFLINE", "").strip().lower() in _TRUTHY


def _wrap_check_amp(original):
    @functools.wraps(original)
    def check_amp(model):
        try:
            device = next(model.parameters()).device
        except (StopIteration, AttributeError):
            return original(model)
        if device.type == "cuda" and _offline():
            from ultralytics.utils import LOGGER, WEIGHTS_DIR

            if not any((WEIGHTS_DIR / w).is_file() for w in ("yolo26n.pt", "yolo11n.pt", "yolov8n.pt")):
                LOGGER.info("AMP: checks skipped (offline and no local reference model); keeping amp=True")
                return True
        return original(model)

    check_amp._yolo_bimamba_original = original
    return check_amp


# ------------------------------------------------------------------------------------------------------- register
def register() -> None:
    """Register our blocks, YAML names, offline fallbacks and the guard with Ultralytics (idempotent)."""
    global _REGISTERED
    with _LOCK:
        if _REGISTERED:
            return
        import ultralytics.engine.trainer as trainer
        import ultralytics.nn.tasks as tasks
        import ultralytics.utils.checks as checks

        if not hasattr(tasks.parse_model, "_yolo_bimamba_original"):
            tasks.parse_model = _make_wrapper(tasks.parse_model)
        if not hasattr(checks.check_file, "_yolo_bimamba_original"):
            old = checks.check_file
            _rebind("check_file", old, _wrap_check_file(old))
        if not hasattr(checks.check_amp, "_yolo_bimamba_original"):
            old = checks.check_amp
            _rebind("check_amp", old, _wrap_check_amp(old))
        if not hasattr(trainer.check_amp, "_yolo_bimamba_original"):  # imported before our rebind: wrap there too
            trainer.check_amp = _wrap_check_amp(trainer.check_amp)
        if not hasattr(checks.check_font, "_yolo_bimamba_original"):
            old = checks.check_font
            _rebind("check_font", old, _wrap_check_font(old))
        for name, cls in blocks().items():
            setattr(tasks, name, cls)
        importlib.import_module("yolo_bimamba.recipe").install()  # SSM parameters without weight decay
        _REGISTERED = True

    if importlib.util.find_spec("yolo_bimamba.guard") is not None:
        importlib.import_module("yolo_bimamba.guard").install()
