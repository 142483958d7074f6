"""nn modules: the BiMamba2 and Hydra mixers, 2D blocks for YOLO feature maps, gated RMSNorm."""
from .bimamba2 import BiMamba2
from .blocks import BiMambaLayer2D, C2fBiMamba
from .hydra import C2fHydra, Hydra, HydraLayer2D
from .norm import RMSNormGated

__all__ = ["BiMamba2", "BiMambaLayer2D", "C2fBiMamba", "Hydra", "HydraLayer2D", "C2fHydra", "RMSNormGated"]
