"""Operators: the bidirectional SSD and its float64 reference; the blocks' fused conv1d + SiLU and gated RMSNorm."""
from .bi_ssd import bi_ssd, bi_ssd_reference
from .dwconv import dwconv_silu
from .gated_norm import gated_rmsnorm

__all__ = ["bi_ssd", "bi_ssd_reference", "dwconv_silu", "gated_rmsnorm"]
