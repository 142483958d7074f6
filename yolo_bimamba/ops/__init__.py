"""Operators: the bidirectional SSD and its float64 reference; the blocks' fused conv1d + SiLU and gated RMSNorm."""
from .bi_ssd import bi_ssd, bi_ssd_reference
from .dwconv import dwconv_silu
from .gated_norm import gated_rmsnorm
from . import library  # noqa: F401,E402  (registers the custom ops torch.compile and torch.export trace)

__all__ = ["bi_ssd", "bi_ssd_reference", "dwconv_silu", "gated_rmsnorm"]
