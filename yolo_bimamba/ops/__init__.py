"""Operators: the bidirectional SSD and its float64 reference."""
from .bi_ssd import bi_ssd
from .reference import bi_ssd_reference

__all__ = ["bi_ssd", "bi_ssd_reference"]
