"""Safe checkpoint loading: this package's module classes on torch's ``weights_only`` allow-list.

A checkpoint of a model with our blocks pickles the model object, so besides Ultralytics' and torch.nn's classes it
names ours (``yolo_bimamba.nn.blocks.C2fBiMamba``, ``...BiMamba2``, ``...RMSNormGated``, ...). ``torch.load(...,
weights_only=True)`` - which Ultralytics' restricted loading (``ULTRALYTICS_SAFE_LOAD=1``) uses, with an allow-list
of its own and torch.nn's classes - refuses any class not registered with ``torch.serialization.add_safe_globals``.

:func:`register_safe_globals` (called by ``import yolo_bimamba``) registers exactly :func:`safe_globals`: the
``nn.Module`` subclasses defined in ``yolo_bimamba.nn``. That is everything of ours a checkpoint holds (CUDA graphs
live in a side table, not on the modules). It loosens nothing for other files: the allow-list only grows by these
names, all plain ``nn.Module`` classes whose unpickling runs ``nn.Module.__setstate__`` and nothing of ours (none
defines ``__reduce__``, ``__reduce_ex__``, ``__setstate__`` or ``__new__``; the tests check it). Any other global a
file names - a function such as ``os.system`` in a reduce, an unknown class, or another of our objects that is not a
module - is refused as before.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import torch
from torch import nn

_UNPICKLING_HOOKS = ("__reduce__", "__reduce_ex__", "__setstate__", "__new__", "__getstate__")


def module_classes() -> list[type]:
    """The ``nn.Module`` classes defined in the ``yolo_bimamba.nn`` modules (sorted by qualified name)."""
    pkg = importlib.import_module("yolo_bimamba.nn")
    found = {}
    for info in pkgutil.iter_modules(pkg.__path__, prefix=f"{pkg.__name__}."):
        mod = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(mod, inspect.isclass):
            if obj.__module__ == mod.__name__ and issubclass(obj, nn.Module):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def safe_globals() -> list[type]:
    """:func:`module_classes` that run no code of their own when unpickled (today: all of them, the tests check it;
    a class that customised unpickling would be left off the list, so files holding it stay refused)."""
    return [c for c in module_classes() if not unpickling_hooks(c)]


def unpickling_hooks(cls: type) -> list[str]:
    """The unpickling-related methods ``cls`` defines itself or inherits from a class other than nn.Module/object."""
    out = []
    for name in _UNPICKLING_HOOKS:
        for base in cls.__mro__:
            if name in vars(base):
                if base not in (nn.Module, object):
                    out.append(f"{base.__qualname__}.{name}")
                break
    return out


_registered = False


def register_safe_globals() -> list[type]:
    """Add :func:`safe_globals` to torch's ``weights_only`` allow-list (idempotent); returns them."""
    global _registered
    classes = safe_globals()
    if not _registered:
        left_off = sorted(c.__qualname__ for c in set(module_classes()) - set(classes))
        if left_off:
            import warnings

            warnings.warn(f"yolo_bimamba: {left_off} customise unpickling, so weights_only loading refuses them",
                          stacklevel=2)
        torch.serialization.add_safe_globals(classes)
        _registered = True
    return classes
