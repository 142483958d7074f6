"""yolo-bimamba: bidirectional Mamba2 (Bi-Mamba2 / Hydra) blocks for Ultralytics YOLO, on fused Triton kernels.

``import yolo_bimamba`` registers the blocks, YAML names, the default dataset, the offline fallbacks (active only
while Ultralytics is offline) and the training guard (active only for models with our blocks, or ``nan_guard=True``)
with Ultralytics (see :mod:`yolo_bimamba.ultralytics_glue`), and puts our module classes on torch's ``weights_only``
allow-list (:mod:`yolo_bimamba.safe_load`). It changes no environment variable or Ultralytics setting.
"""
from .ultralytics_glue import register
from .nn import BiMamba2, BiMambaLayer2D, C2fBiMamba, C2fHydra, Hydra, HydraLayer2D  # noqa: E402
from .nn import C2fPlusBiMamba, C2PSABiMamba, C3k2BiMamba, SPPFBiMamba  # noqa: E402
from .ops import bi_ssd, bi_ssd_reference  # noqa: E402
from .inference import graph_inference  # noqa: E402
from .safe_load import register_safe_globals  # noqa: E402
from .swap import swap_hydra  # noqa: E402
from .transfer import transfer_report  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "bi_ssd", "bi_ssd_reference", "BiMamba2", "BiMambaLayer2D", "C2fBiMamba", "Hydra", "HydraLayer2D", "C2fHydra",
    "swap_hydra", "register", "SPPFBiMamba", "C2PSABiMamba", "C3k2BiMamba", "C2fPlusBiMamba", "transfer_report",
    "graph_inference",
]

register()
register_safe_globals()
