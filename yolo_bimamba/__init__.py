"""yolo-bimamba: bidirectional Mamba2 (Bi-Mamba2 / Hydra) blocks for Ultralytics YOLO, on fused Triton kernels.

``import yolo_bimamba`` registers the blocks, YAML names, the default dataset, the offline fixes and the
training guard with Ultralytics (see :mod:`yolo_bimamba.ultralytics_glue`).
"""
from .ultralytics_glue import register  # first: sets the offline defaults before anything imports Ultralytics
from .nn import BiMamba2, BiMambaLayer2D, C2fBiMamba, C2fHydra, Hydra, HydraLayer2D  # noqa: E402
from .nn import C2fPlusBiMamba, C2PSABiMamba, C3k2BiMamba, SPPFBiMamba  # noqa: E402
from .ops import bi_ssd, bi_ssd_reference  # noqa: E402
from .inference import graph_inference  # noqa: E402
from .swap import swap_hydra  # noqa: E402
from .transfer import transfer_report  # noqa: E402

__version__ = "0.1.0"
__all__ = [
    "bi_ssd", "bi_ssd_reference", "BiMamba2", "BiMambaLayer2D", "C2fBiMamba", "Hydra", "HydraLayer2D", "C2fHydra",
    "swap_hydra", "register", "SPPFBiMamba", "C2PSABiMamba", "C3k2BiMamba", "C2fPlusBiMamba", "transfer_report",
    "graph_inference",
]

register()
