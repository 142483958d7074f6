"""nn modules: the BiMamba2 and Hydra mixers, 2D blocks for YOLO feature maps (and stock Ultralytics modules extended
by one, keeping their weights), gated RMSNorm."""
from .bimamba2 import BiMamba2
from .blocks import BiMambaLayer2D, C2fBiMamba
from .extend import C2fPlusBiMamba, C2PSABiMamba, C3k2BiMamba, SPPFBiMamba
from .hydra import C2fHydra, Hydra, HydraLayer2D
from .norm import RMSNormGated

__all__ = ["BiMamba2", "BiMambaLayer2D", "C2fBiMamba", "Hydra", "HydraLayer2D", "C2fHydra", "RMSNormGated",
           "SPPFBiMamba", "C2PSABiMamba", "C3k2BiMamba", "C2fPlusBiMamba"]
