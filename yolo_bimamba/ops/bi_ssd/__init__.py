"""The bidirectional SSD op (Bi-Mamba2 / Hydra), by stage: the API (validation, backend choice), the PyTorch backend,
the float64 reference, and the Triton backend (autograd function, tuning, kernels)."""
from .api import bi_ssd
from .reference import bi_ssd_reference
from . import library  # noqa: F401  (registers the custom ops torch.compile and torch.export trace)

__all__ = ["bi_ssd", "bi_ssd_reference"]
