"""Blocks that extend a stock Ultralytics module with a residual BiMamba2 layer, keeping its weights' names.

Each block here IS the stock module (a subclass: same constructor, same submodules ``cv1``, ``cv2``, ``m``, ... under
the same names) followed by one :class:`~yolo_bimamba.nn.blocks.BiMambaLayer2D` on its output, held as ``mix``:

    y = stock.forward(x);  out = y + gamma * mixer(LN(y))        (per channel gamma, ``layer_scale``)

Put at the layer index of the stock module it extends, the block's state_dict holds every key of the stock layer
(``model.9.cv1.conv.weight``, ...) with the same shape, plus ``model.9.mix.*``: Ultralytics' pretrained transfer
(``DetectionModel.load``: tensors whose name and shape match) then copies every stock weight, and with the default
``layer_scale=0.0`` the new layer starts as the exact identity, so the model's outputs at step 0 are the stock
model's.

In YAML rows the blocks take the stock module's arguments, plus an optional trailing mapping of keyword arguments
for the BiMamba layer (``scan``, ``mlp_ratio``, ``layer_scale``, ``d_state``, ``headdim``, ...). The parse_model
wrapper (:mod:`yolo_bimamba.ultralytics_glue`) rewrites such a row to the stock module named by ``stock_name``, lets
Ultralytics build it with all of its channel, depth and version rules, and turns the built layer into the block with
:meth:`StockExtension.from_stock`.
"""
from __future__ import annotations

import inspect

import torch
from torch import nn
from ultralytics.nn.modules import C2PSA, SPPF, C2f, C3k2

from .blocks import BiMambaLayer2D

__all__ = ["StockExtension", "SPPFBiMamba", "C2PSABiMamba", "C3k2BiMamba", "C2fPlusBiMamba", "EXTENSION_LAYER_DEFAULTS"]

#: Keyword defaults of the added layer: an exact identity at step 0 (see BiMambaLayer2D's ``layer_scale``).
EXTENSION_LAYER_DEFAULTS = dict(layer_scale=0.0)


class StockExtension:
    """Mixin: ``stock`` (an Ultralytics module class, also a base of the block) followed by a residual layer ``mix``.

    Subclasses list the stock class first among their bases after this mixin, e.g.
    ``class SPPFBiMamba(StockExtension, SPPF)``, and set ``stock``.
    """

    stock: type = None
    layer_cls = BiMambaLayer2D

    def __init__(self, *args, **kwargs):
        """The stock constructor's arguments (positional or by name); any other keyword goes to the added layer."""
        names = set(inspect.signature(self.stock.__init__).parameters) - {"self"}
        stock_kw = {k: v for k, v in kwargs.items() if k in names}
        layer_kw = {k: v for k, v in kwargs.items() if k not in names}
        self.stock.__init__(self, *args, **stock_kw)
        self._add_layer(**layer_kw)

    @classmethod
    def stock_name(cls) -> str:
        """The name of the stock module in YAML rows (e.g. ``"SPPF"``)."""
        return cls.stock.__name__

    @classmethod
    def from_stock(cls, layer: nn.Module, **layer_kwargs):
        """The block made of ``layer`` (a built ``cls.stock``, whose submodules and attributes it takes over as they
        are, so whatever Ultralytics did to it after construction is kept) and a new ``mix`` layer."""
        if type(layer) is not cls.stock:
            raise TypeError(f"{cls.__name__}.from_stock: expected a built {cls.stock.__name__}, got "
                            f"{type(layer).__name__} (a YAML row of {cls.__name__} must build one module: repeats 1 "
                            "unless the stock module takes a repeat count)")
        block = cls.__new__(cls)
        block.__dict__.update(layer.__dict__)
        for k in ("_parameters", "_buffers", "_modules"):  # own containers: adding `mix` leaves `layer` unchanged
            block.__dict__[k] = type(layer.__dict__[k])(layer.__dict__[k])
        block._add_layer(**layer_kwargs)
        return block

    def out_channels(self) -> int:
        return self.cv2.conv.out_channels

    def _add_layer(self, **layer_kwargs):
        p = next(self.parameters(), None)
        self.mix = self.layer_cls(self.out_channels(), **{**EXTENSION_LAYER_DEFAULTS, **layer_kwargs})
        if p is not None:
            self.mix.to(device=p.device, dtype=p.dtype)
        self.mix.train(self.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(self.stock.forward(self, x))


class SPPFBiMamba(StockExtension, SPPF):
    """SPPF (YOLOv8 / YOLO11 / YOLO26 layer 9) followed by a residual BiMamba2 layer: global context at P5."""

    stock = SPPF


class C2PSABiMamba(StockExtension, C2PSA):
    """YOLO11 / YOLO26's C2PSA attention block (layer 10) followed by a residual BiMamba2 layer."""

    stock = C2PSA


class _C2fFamily(StockExtension):
    def forward_split(self, x: torch.Tensor) -> torch.Tensor:
        # Ultralytics' exporter replaces forward by forward_split on every C2f instance (ours too): keep the layer
        return self.mix(self.stock.forward_split(self, x))


class C3k2BiMamba(_C2fFamily, C3k2):
    """YOLO11 / YOLO26's C3k2 CSP block followed by a residual BiMamba2 layer."""

    stock = C3k2


class C2fPlusBiMamba(_C2fFamily, C2f):
    """YOLOv8's C2f followed by a residual BiMamba2 layer (C2f's weights kept). Not :class:`C2fBiMamba`, which puts
    BiMamba2 layers in place of C2f's bottlenecks (a different module with other weights)."""

    stock = C2f


EXTENSIONS = (SPPFBiMamba, C2PSABiMamba, C3k2BiMamba, C2fPlusBiMamba)
