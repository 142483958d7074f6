"""Build hooks for yolo-bimamba (all metadata lives in pyproject.toml).

1. The model / dataset YAMLs of the top-level ``cfg/`` are installed inside the package as ``yolo_bimamba/cfg/``
   (an editable install reads the repository's ``cfg/`` directly, see ``yolo_bimamba.ultralytics_glue.cfg_dir``).
2. ``yolo_bimamba_autoload.pth`` is placed at the root of site-packages, for ``pip install .`` (via build_py into the
   wheel's purelib root) and for ``pip install -e .`` (added to the editable wheel, which does not ship extra files of
   the build by default). It embeds the source of ``yolo_bimamba/_autoload.py``: an import hook that imports
   ``yolo_bimamba`` (registering our blocks) right after ``ultralytics`` is imported, so the stock ``yolo`` CLI sees
   the blocks. It imports nothing heavy at interpreter start.
"""

import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py

HERE = Path(os.path.dirname(os.path.abspath(__file__)))
PTH_NAME = "yolo_bimamba_autoload.pth"


def pth_text() -> str:
    src = (HERE / "yolo_bimamba" / "_autoload.py").read_text(encoding="utf-8")
    code = f"exec(compile({ascii(src)}, {PTH_NAME!r}, 'exec'), {{'__name__': 'yolo_bimamba_autoload'}})"
    return f"import os, sys; {code}\n"  # a .pth line is executed only when it starts with 'import'


class build_py(_build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        cfg_out = Path(self.build_lib, "yolo_bimamba", "cfg")
        cfg_out.mkdir(parents=True, exist_ok=True)
        for f in sorted((HERE / "cfg").glob("*.yaml")):
            self.copy_file(str(f), str(cfg_out / f.name))
        Path(self.build_lib, PTH_NAME).write_text(pth_text(), encoding="utf-8")

    def get_outputs(self, include_bytecode=True):
        outs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            outs += [str(Path(self.build_lib, "yolo_bimamba", "cfg", f.name)) for f in sorted((HERE / "cfg").glob("*.yaml"))]
            outs.append(str(Path(self.build_lib, PTH_NAME)))
        return outs


cmdclass = {"build_py": build_py}

try:  # setuptools >= 64 (PEP 660 editable installs)
    from setuptools.command.editable_wheel import editable_wheel as _editable_wheel
except ImportError:  # pragma: no cover
    _editable_wheel = None

if _editable_wheel is not None and hasattr(_editable_wheel, "_select_strategy"):

    class _StrategyWithPth:
        """Wraps setuptools' editable strategy and adds our .pth to the editable wheel."""

        def __init__(self, inner):
            self._inner = inner

        def __enter__(self):
            self._inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self._inner.__exit__(*exc)

        def __call__(self, wheel, files, mapping):
            self._inner(wheel, files, mapping)
            wheel.writestr(PTH_NAME, pth_text().encode("utf-8"))

    class editable_wheel(_editable_wheel):
        def _select_strategy(self, *args, **kwargs):
            return _StrategyWithPth(super()._select_strategy(*args, **kwargs))

    cmdclass["editable_wheel"] = editable_wheel

if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it for pth_text()
    setup(cmdclass=cmdclass)
