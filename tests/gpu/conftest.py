"""Set-up of the GPU suite (tests/gpu).

The GPU machines these tests run on may have torch and Triton but no Ultralytics, while
``import yolo_bimamba`` registers our blocks with Ultralytics. The kernels and the op
(``yolo_bimamba.ops``) need neither, so where Ultralytics is not installed the package is
entered without running its ``__init__`` (its subpackages import normally). Nothing is replaced:
the op, the kernels and the reference are the package's own code.
"""
import importlib.util
import os
import sys
import types

# every direct kernel launch (yolo_bimamba.ops.launch) also asks Triton how it specialises the arguments and fails
# if that differs from the kept kernel's: the whole suite checks the launch cache's key
os.environ.setdefault("YOLO_BIMAMBA_CHECK_LAUNCH", "1")


def _enter_package_without_glue():
    if "yolo_bimamba" in sys.modules or importlib.util.find_spec("ultralytics") is not None:
        return
    spec = importlib.util.find_spec("yolo_bimamba")
    if spec is None or not spec.submodule_search_locations:
        return
    pkg = types.ModuleType("yolo_bimamba")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__file__ = spec.origin
    pkg.__spec__ = spec
    sys.modules["yolo_bimamba"] = pkg


_enter_package_without_glue()


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): tests sharing kernel compiles (pytest-xdist --dist loadgroup)")
