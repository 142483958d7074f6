"""Import hook that registers yolo-bimamba with Ultralytics as soon as ``ultralytics`` is imported.

This file is not imported as part of the package: at install time its source is embedded into
``yolo_bimamba_autoload.pth`` in site-packages (see setup.py), which Python's ``site`` module executes at interpreter
start. It must stay cheap and stdlib-only (no torch, no ultralytics, no yolo_bimamba at start-up) and
self-contained, since a ``.pth`` line cannot rely on other ``.pth`` files (e.g. an editable install's finder) having
run first.

What it does: it puts a one-shot finder at the front of ``sys.meta_path``. When ``ultralytics`` is first imported,
the finder lets the regular machinery locate the package and wraps its loader so that, right after
``ultralytics/__init__.py`` has executed, ``import yolo_bimamba`` runs (which registers the blocks, the YAML names
and the offline fixes). So the stock ``yolo`` console script, ``python -c "from ultralytics import YOLO"``, DDP
worker processes etc. all see the blocks. Set ``YOLO_BIMAMBA_AUTOLOAD=0`` to disable it.
"""

import os
import sys


def _yolo_bimamba_autoload_install():
    if os.environ.get("YOLO_BIMAMBA_AUTOLOAD", "1").strip().lower() in ("0", "false", "no", "off", "n", "f"):
        return
    if any(getattr(f, "_yolo_bimamba_hook", False) for f in sys.meta_path):
        return

    def _register():
        try:
            import yolo_bimamba  # noqa: F401  (its __init__ registers with Ultralytics)
        except Exception as e:  # never break `import ultralytics` because of us
            import warnings

            warnings.warn(f"yolo-bimamba: automatic registration with Ultralytics failed: {e!r}", stacklevel=2)

    class _Loader:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def create_module(self, spec):
            return self._inner.create_module(spec)

        def exec_module(self, module):
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._inner
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._inner
            self._inner.exec_module(module)
            _register()

    class _Finder:
        _yolo_bimamba_hook = True

        def __init__(self):
            self._busy = False

        def find_spec(self, name, path=None, target=None):
            if name != "ultralytics" or self._busy:
                return None
            self._busy = True
            try:
                import importlib.util

                spec = importlib.util.find_spec(name)
            finally:
                self._busy = False
            if self in sys.meta_path:
                sys.meta_path.remove(self)  # one-shot
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            spec.loader = _Loader(spec.loader)
            return spec

    if "ultralytics" in sys.modules:
        _register()
    else:
        sys.meta_path.insert(0, _Finder())


_yolo_bimamba_autoload_install()
