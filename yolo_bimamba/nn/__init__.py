"""nn modules: the BiMamba2 mixer, 2D blocks for YOLO feature maps, gated RMSNorm."""
from .bimamba2 import BiMamba2
from .blocks import BiMambaLayer2D, C2fBiMamba
from .norm import RMSNormGated

__all__ = ["BiMamba2", "BiMambaLayer2D", "C2fBiMamba", "RMSNormGated"]
