"""Swap Hydra blocks in any model for ``yolo_bimamba`` modules, in place, weights copied.

``swap_hydra(model, target)`` walks an ``nn.Module`` tree and replaces every Hydra mixer:

* found as an instance of the published class (``hydra.modules.hydra.Hydra``, when that
  package imports), or recognised by structure: the exact parameter set of the published
  Hydra (``in_proj``, ``conv1d``, ``dt_bias``, ``A_log``, ``D``, ``fc_D``, ``norm.weight``,
  ``out_proj``, optionally ``init_states`` and biases) with shapes that fit together as they do
  there (``d_inner = fc_D.in_features``, ``nheads = A_log.numel()``, conv channels
  ``d_inner + 4 * ngroups * d_state``, in_proj rows ``2 * d_inner + 4 * ngroups * d_state + 2 * nheads``,
  odd depthwise kernel with 'same' padding), ``ngroups`` / ``d_state`` read from the
  module's attributes. Our own :class:`yolo_bimamba.nn.Hydra` counts as a Hydra block too.

``target="hydra"`` -> :class:`yolo_bimamba.nn.Hydra`: the same function exactly (same keys,
shapes, dtypes; every tensor copied), computed with the fused Hydra mode of ``bi_ssd``.

``target="bimamba2"`` -> :class:`yolo_bimamba.nn.BiMamba2`, a starting point for fine-tuning
(not the same function). Weight mapping, with di = d_inner, gn = ngroups * d_state,
h = nheads; Hydra in_proj rows are z | x | B_f | C_f | B_b | C_b | dt_f | dt_b, conv channels
x | B_f | C_f | B_b | C_b, BiMamba2 in_proj rows z | x | B | C | dt, conv channels x | B | C:

=============================================  =============================================
BiMamba2                                       from Hydra
=============================================  =============================================
in_proj rows [0, 2di + 2gn)   (z, x, B, C)     in_proj rows [0, 2di + 2gn)   (z, x, B_f, C_f)
in_proj rows [2di + 2gn, 2di + 2gn + h) (dt)   in_proj rows [2di + 4gn, 2di + 4gn + h) (dt_f)
conv1d channels [0, di + 2gn)  (x, B, C)       conv1d channels [0, di + 2gn)  (x, B_f, C_f)
dt_bias, A_log, D, norm.weight, out_proj.*     the same tensors
(dropped)                                      in_proj/conv rows of B_b, C_b; dt_b rows;
                                               fc_D.weight; init_states
=============================================  =============================================

The gated norm keeps Hydra's placement (norm before gate, same eps). BiMamba2 then scans with
the forward direction's B, C and dt in both directions, includes the diagonal in both scans
and has a constant skip ``D`` (Hydra: shifted scans, data-dependent skip ``x * (fc_D(x) + D)``).

For Ultralytics checkpoints: ``swap_hydra_checkpoint(in_pt, out_pt, target)`` swaps both the
``model`` and ``ema`` entries and keeps the rest of the dict (the optimizer state is dropped
for target="bimamba2", whose parameters differ); ``cli_main(argv)`` is the
``yolo-bimamba swap-hydra IN.pt OUT.pt [--target hydra|bimamba2]`` command. When the model
carries an Ultralytics YAML dict, the target is recorded in it under ``SWAP_YAML_KEY`` so
that a model rebuilt from that YAML (Ultralytics does so when it trains from a checkpoint)
is swapped the same way: the parse_model wrapper of :mod:`yolo_bimamba.ultralytics_glue` applies it.
"""
from __future__ import annotations

import argparse
import io
import pickle
import sys
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

import torch
from torch import nn

from .nn.bimamba2 import BiMamba2
from .nn.hydra import Hydra

TARGETS = ("hydra", "bimamba2")
#: key of an Ultralytics model YAML dict under which the swap target is recorded
SWAP_YAML_KEY = "yolo_bimamba_hydra_swap"
#: where the published classes live (module, class name)
PUBLISHED_HYDRA = ("hydra.modules.hydra", "Hydra")
PUBLISHED_NORMS = (("mamba_ssm.ops.triton.layernorm_gated", "RMSNorm"),)


def _published_hydra_class():
    """The published Hydra class, or None when it cannot be imported (mamba_ssm missing, or the
    unrelated ``hydra-core`` package owning the ``hydra`` name)."""
    try:
        mod = __import__(PUBLISHED_HYDRA[0], fromlist=[PUBLISHED_HYDRA[1]])
        return getattr(mod, PUBLISHED_HYDRA[1])
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None


@dataclass
class HydraSpec:
    """Constructor arguments of a detected Hydra block, plus its norm's settings."""

    d_model: int
    d_state: int
    d_conv: int
    expand: int
    headdim: int
    ngroups: int
    dt_limit: tuple
    learnable_init_states: bool
    activation: str
    bias: bool
    conv_bias: bool
    chunk_size: int
    layer_idx: object
    use_mem_eff_path: bool
    norm_eps: float
    norm_before_gate: bool
    detected_by: str

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    def hydra_kwargs(self) -> dict:
        return dict(
            d_model=self.d_model, d_state=self.d_state, d_conv=self.d_conv, expand=self.expand,
            headdim=self.headdim, ngroups=self.ngroups, dt_limit=self.dt_limit,
            learnable_init_states=self.learnable_init_states, activation=self.activation, bias=self.bias,
            conv_bias=self.conv_bias, chunk_size=self.chunk_size, use_mem_eff_path=self.use_mem_eff_path,
            layer_idx=self.layer_idx,
        )


class NotHydra(Exception):
    """Raised by :func:`detect_hydra` with the reason a module is not a usable Hydra block."""


def _int_attr(m, name):
    v = getattr(m, name, None)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def detect_hydra(m: nn.Module) -> HydraSpec:
    """Return the HydraSpec of ``m`` or raise :class:`NotHydra` with the reason."""
    if isinstance(m, Hydra):
        how = "yolo_bimamba"
    else:
        cls = _published_hydra_class()
        how = "class" if cls is not None and isinstance(m, cls) else "structure"
    parts = {k: getattr(m, k, None) for k in ("in_proj", "conv1d", "fc_D", "out_proj", "norm")}
    if not (isinstance(parts["in_proj"], nn.Linear) and isinstance(parts["fc_D"], nn.Linear)
            and isinstance(parts["out_proj"], nn.Linear) and isinstance(parts["conv1d"], nn.Conv1d)
            and isinstance(parts["norm"], nn.Module)):
        raise NotHydra("no in_proj/conv1d/fc_D/out_proj Linear/Conv1d children and norm")
    for k in ("dt_bias", "A_log", "D"):
        if not isinstance(getattr(m, k, None), nn.Parameter) or getattr(m, k).dim() != 1:
            raise NotHydra(f"no 1-D parameter {k}")
    in_proj, conv, fc_D, out_proj, norm = (parts[k] for k in ("in_proj", "conv1d", "fc_D", "out_proj", "norm"))
    h = m.A_log.numel()
    di = fc_D.in_features
    d_model = in_proj.in_features
    if fc_D.out_features != h or m.dt_bias.numel() != h or m.D.numel() != h or di % h != 0:
        raise NotHydra("fc_D / dt_bias / A_log / D shapes do not fit one nheads")
    headdim = di // h
    if di % d_model != 0:
        raise NotHydra(f"d_inner = {di} is not a multiple of d_model = {d_model}")
    conv_dim = conv.in_channels
    if conv.out_channels != conv_dim or conv.groups != conv_dim or (conv_dim - di) <= 0 or (conv_dim - di) % 4:
        raise NotHydra("conv1d is not depthwise over x | B_f | C_f | B_b | C_b")
    gn = (conv_dim - di) // 4
    if in_proj.out_features != 2 * di + 4 * gn + 2 * h:
        raise NotHydra("in_proj rows are not z | x | B_f | C_f | B_b | C_b | dt_f | dt_b")
    if out_proj.in_features != di or out_proj.out_features != d_model:
        raise NotHydra("out_proj is not d_inner -> d_model")
    k = conv.kernel_size[0]
    if k % 2 != 1 or tuple(conv.padding) != (k // 2,) or tuple(conv.stride) != (1,) or tuple(conv.dilation) != (1,):
        raise NotHydra("conv1d is not an odd kernel with 'same' padding, stride 1, dilation 1")
    nw = getattr(norm, "weight", None)
    if not isinstance(nw, nn.Parameter) or tuple(nw.shape) != (di,):
        raise NotHydra("norm has no weight of shape (d_inner,)")
    group_size = getattr(norm, "group_size", None)
    if group_size not in (None, di):
        raise NotHydra(f"norm group_size = {group_size} (grouped gated norms are not supported)")
    ngroups, d_state = _int_attr(m, "ngroups"), _int_attr(m, "d_state")
    if ngroups is None and d_state is not None and d_state > 0 and gn % d_state == 0:
        ngroups = gn // d_state
    if d_state is None and ngroups is not None and ngroups > 0 and gn % ngroups == 0:
        d_state = gn // ngroups
    if ngroups is None or d_state is None or ngroups * d_state != gn or h % ngroups:
        raise NotHydra("cannot tell ngroups and d_state apart (attributes ngroups/d_state missing or inconsistent)")
    init = getattr(m, "init_states", None)
    learnable = isinstance(init, nn.Parameter)
    if learnable and tuple(init.shape) != (h, headdim, d_state):
        raise NotHydra("init_states has the wrong shape")
    has_bias = in_proj.bias is not None
    if (out_proj.bias is not None) != has_bias:
        raise NotHydra("in_proj and out_proj disagree on bias")
    expected = {"in_proj.weight", "conv1d.weight", "dt_bias", "A_log", "D", "fc_D.weight", "norm.weight", "out_proj.weight"}
    if has_bias:
        expected |= {"in_proj.bias", "out_proj.bias"}
    if conv.bias is not None:
        expected.add("conv1d.bias")
    if learnable:
        expected.add("init_states")
    if fc_D.bias is not None:
        raise NotHydra("fc_D has a bias")
    if getattr(norm, "bias", None) is not None:
        raise NotHydra("norm has a bias")
    got = set(m.state_dict().keys())
    if got != expected:
        raise NotHydra(f"state_dict keys differ from Hydra's: extra {sorted(got - expected)}, missing {sorted(expected - got)}")
    activation = getattr(m, "activation", "swish")
    if activation not in ("swish", "silu"):
        raise NotHydra(f"activation {activation!r}")
    dt_limit = getattr(m, "dt_limit", (0.0, float("inf")))
    chunk = _int_attr(m, "chunk_size") or 256
    return HydraSpec(
        d_model=d_model, d_state=d_state, d_conv=k, expand=di // d_model, headdim=headdim, ngroups=ngroups,
        dt_limit=(float(dt_limit[0]), float(dt_limit[1])), learnable_init_states=learnable, activation=activation,
        bias=has_bias, conv_bias=conv.bias is not None, chunk_size=chunk, layer_idx=getattr(m, "layer_idx", None),
        use_mem_eff_path=bool(getattr(m, "use_mem_eff_path", False)), norm_eps=float(getattr(norm, "eps", 1e-5)),
        norm_before_gate=bool(getattr(norm, "norm_before_gate", True)), detected_by=how,
    )


def _param_like(dst: nn.Module, name: str, value: torch.Tensor, src_param: torch.Tensor) -> None:
    """Set parameter ``name`` of ``dst`` to a copy of ``value`` with ``src_param``'s dtype/device/grad flag."""
    mod_name, _, leaf = name.rpartition(".")
    mod = dst.get_submodule(mod_name) if mod_name else dst
    old = getattr(mod, leaf)
    new = nn.Parameter(value.detach().to(device=src_param.device, dtype=src_param.dtype).clone(),
                       requires_grad=src_param.requires_grad)
    if hasattr(old, "_no_weight_decay"):
        new._no_weight_decay = old._no_weight_decay
    setattr(mod, leaf, new)


def _device(src: nn.Module):
    return src.in_proj.weight.device


def to_hydra(src: nn.Module, spec: HydraSpec | None = None) -> Hydra:
    """An exact :class:`yolo_bimamba.nn.Hydra` copy of a Hydra block (every tensor, dtype, flag)."""
    spec = spec or detect_hydra(src)
    with torch.device("meta"):
        new = Hydra(**spec.hydra_kwargs())
    src_params = dict(src.named_parameters())
    for name in dict(new.named_parameters()):
        _param_like(new, name, src_params[name], src_params[name])
    new.norm.eps = spec.norm_eps
    new.norm.norm_before_gate = spec.norm_before_gate
    new.train(src.training)
    return new


def bimamba2_mapping(spec: HydraSpec) -> dict:
    """{BiMamba2 key: (Hydra key, [(dst_start, dst_stop, src_start), ...] on dim 0 or None for all)}."""
    di, gn, h = spec.d_inner, spec.ngroups * spec.d_state, spec.nheads
    rows = [(0, 2 * di + 2 * gn, 0), (2 * di + 2 * gn, 2 * di + 2 * gn + h, 2 * di + 4 * gn)]
    conv = [(0, di + 2 * gn, 0)]
    mp = {"in_proj.weight": ("in_proj.weight", rows), "conv1d.weight": ("conv1d.weight", conv)}
    if spec.bias:
        mp["in_proj.bias"] = ("in_proj.bias", rows)
        mp["out_proj.bias"] = ("out_proj.bias", None)
    if spec.conv_bias:
        mp["conv1d.bias"] = ("conv1d.bias", conv)
    for k in ("dt_bias", "A_log", "D", "norm.weight", "out_proj.weight"):
        mp[k] = (k, None)
    return mp


def to_bimamba2(src: nn.Module, spec: HydraSpec | None = None) -> BiMamba2:
    """A :class:`yolo_bimamba.nn.BiMamba2` initialised from a Hydra block (see the module doc)."""
    spec = spec or detect_hydra(src)
    kw = spec.hydra_kwargs()
    kw["learnable_init_states"] = False
    with torch.device("meta"):
        new = BiMamba2(**kw)
    sd = dict(src.named_parameters())
    for dst_key, (src_key, ranges) in bimamba2_mapping(spec).items():
        s = sd[src_key]
        if ranges is None:
            val = s.detach()
        else:
            val = torch.cat([s.detach()[a: a + (e - b)] for (b, e, a) in ranges], dim=0)
        dst_shape = tuple(new.get_parameter(dst_key).shape)
        if tuple(val.shape) != dst_shape:
            raise RuntimeError(f"mapping bug: {dst_key} {tuple(val.shape)} != {dst_shape}")
        _param_like(new, dst_key, val, s)
    if any(p.is_meta for p in new.parameters()):
        raise RuntimeError("mapping bug: BiMamba2 parameter left uninitialised")
    new.norm.eps = spec.norm_eps
    new.norm.norm_before_gate = spec.norm_before_gate
    new.backend = "auto"
    new.train(src.training)
    return new


def convert_hydra(module: nn.Module, target: str = "hydra") -> nn.Module:
    """Convert one Hydra block (see :func:`swap_hydra`); raises ValueError if it is none."""
    if target not in TARGETS:
        raise ValueError(f"swap_hydra: target must be one of {TARGETS}, got {target!r}")
    try:
        spec = detect_hydra(module)
    except NotHydra as exc:
        raise ValueError(f"swap_hydra: {type(module).__name__} is not a Hydra block: {exc}") from None
    return to_hydra(module, spec) if target == "hydra" else to_bimamba2(module, spec)


@dataclass
class SwapReport:
    """What :func:`swap_hydra` did: ``replaced`` and ``kept`` entries are dicts
    (name, source, detected_by, target, params, dropped), ``aliases`` names that pointed to an
    already replaced block."""

    target: str
    replaced: list = field(default_factory=list)
    kept: list = field(default_factory=list)
    aliases: list = field(default_factory=list)

    @property
    def found(self) -> int:
        return len(self.replaced) + len(self.kept)

    def __len__(self) -> int:
        return len(self.replaced)

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        lines = [f"swap_hydra(target={self.target!r}): {len(self.replaced)} replaced, {len(self.kept)} kept"]
        for e in self.replaced:
            drop = f", dropped {', '.join(e['dropped'])}" if e["dropped"] else ""
            lines.append(f"  {e['name']}: {e['source']} ({e['detected_by']}) -> {e['target']}, {e['params']} params{drop}")
        for e in self.kept:
            lines.append(f"  {e['name']}: already {e['source']}, kept")
        for a in self.aliases:
            lines.append(f"  {a}: alias of a replaced block, re-pointed")
        return "\n".join(lines)


def _qualname(m: nn.Module) -> str:
    t = type(m)
    return f"{t.__module__}.{t.__qualname__}"


def swap_hydra(model: nn.Module, target: str = "hydra") -> SwapReport:
    """Replace every Hydra block inside ``model`` in place (see the module doc); return a report.

    Blocks shared under several names are converted once and every reference re-pointed.
    ``target="hydra"`` leaves blocks that already are ``yolo_bimamba.nn.Hydra`` untouched.
    If ``model`` carries an Ultralytics YAML dict (``model.yaml``), the target is recorded in it
    under ``SWAP_YAML_KEY`` (applied by the parse_model wrapper of :mod:`yolo_bimamba.ultralytics_glue`).
    """
    if target not in TARGETS:
        raise ValueError(f"swap_hydra: target must be one of {TARGETS}, got {target!r}")
    if not isinstance(model, nn.Module):
        raise ValueError(f"swap_hydra: model must be an nn.Module, got {type(model).__name__}")
    try:
        detect_hydra(model)
    except NotHydra:
        pass
    else:
        raise ValueError("swap_hydra: the model itself is a Hydra block; use convert_hydra(module, target)")
    report = SwapReport(target=target)
    done: dict[int, nn.Module] = {}
    visited: set[int] = set()

    def visit(parent: nn.Module, prefix: str) -> None:
        if id(parent) in visited:
            return
        visited.add(id(parent))
        for cname, child in list(parent._modules.items()):
            if child is None:
                continue
            full = f"{prefix}.{cname}" if prefix else cname
            if id(child) in done:
                if done[id(child)] is not child:
                    setattr(parent, cname, done[id(child)])
                    report.aliases.append(full)
                continue
            try:
                spec = detect_hydra(child)
            except NotHydra:
                visit(child, full)
                continue
            if target == "hydra" and isinstance(child, Hydra):
                done[id(child)] = child
                report.kept.append(dict(name=full, source=_qualname(child), detected_by=spec.detected_by,
                                        target=_qualname(child), params=0, dropped=[]))
                continue
            new = to_hydra(child, spec) if target == "hydra" else to_bimamba2(child, spec)
            dropped = []
            if target == "bimamba2":
                dropped = ["in_proj/conv1d rows of B_b, C_b", "in_proj rows of dt_b", "fc_D.weight"]
                if spec.learnable_init_states:
                    dropped.append("init_states")
            done[id(child)] = new
            setattr(parent, cname, new)
            report.replaced.append(dict(
                name=full, source=_qualname(child), detected_by=spec.detected_by, target=_qualname(new),
                params=sum(p.numel() for p in new.parameters()), dropped=dropped,
            ))

    visit(model, "")
    yaml = getattr(model, "yaml", None)
    if report.replaced and isinstance(yaml, dict):
        yaml[SWAP_YAML_KEY] = target
    return report


# ----------------------------------------------------------------------------- Ultralytics

def apply_yaml_swap(model: nn.Module, yaml_dict) -> SwapReport | None:
    """Swap ``model`` as recorded in an Ultralytics YAML dict (no-op without the key)."""
    if not isinstance(yaml_dict, dict) or not yaml_dict.get(SWAP_YAML_KEY):
        return None
    return swap_hydra(model, target=yaml_dict[SWAP_YAML_KEY])


class _UnavailableModule(nn.Module):
    """Stand-in for a pickled module class that cannot be imported (published Hydra / its norm).

    It carries the unpickled parameters and attributes so that :func:`swap_hydra` can read
    them; it cannot run and must not survive a swap.
    """

    _source = "?"

    def forward(self, *args, **kwargs):
        raise RuntimeError(f"{self._source} is not importable here; swap it with yolo_bimamba.swap_hydra first")


_STANDINS: dict = {}


def _standin(module: str, name: str):
    key = (module, name)
    if key not in _STANDINS:
        _STANDINS[key] = type(name, (_UnavailableModule,), {"_source": f"{module}.{name}", "__module__": __name__})
    return _STANDINS[key]


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            if (module, name) == PUBLISHED_HYDRA or (module, name) in PUBLISHED_NORMS:
                return _standin(module, name)
            raise


_pickle_module = SimpleNamespace(
    Unpickler=_Unpickler, load=lambda f, **kw: _Unpickler(f, **kw).load(), __name__="yolo_bimamba_swap_pickle"
)


def load_checkpoint(path):
    """torch.load an Ultralytics checkpoint; published Hydra classes need not be importable."""
    return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_pickle_module)


def _standins_left(m: nn.Module) -> list:
    return [n or "<root>" for n, x in m.named_modules() if isinstance(x, _UnavailableModule)]


def swap_hydra_checkpoint(in_pt, out_pt, target: str = "hydra") -> dict:
    """Swap the Hydra blocks of an Ultralytics ``.pt`` (its ``model`` and ``ema``) and save it.

    Returns {entry: SwapReport}. The rest of the checkpoint dict is kept; for
    target="bimamba2" the optimizer state (for other parameter shapes) is dropped, so the
    result is a fine-tuning start rather than a resumable run. Raises ValueError if the
    checkpoint holds no model or no Hydra block.
    """
    if target not in TARGETS:
        raise ValueError(f"swap_hydra: target must be one of {TARGETS}, got {target!r}")
    ckpt = load_checkpoint(in_pt)
    if isinstance(ckpt, nn.Module):
        ckpt = {"model": ckpt}
    if not isinstance(ckpt, dict):
        raise ValueError(f"swap_hydra_checkpoint: {in_pt} holds a {type(ckpt).__name__}, not a checkpoint dict")
    reports = {}
    for key in ("model", "ema"):
        m = ckpt.get(key)
        if isinstance(m, nn.Module):
            reports[key] = swap_hydra(m, target)
            left = _standins_left(m)
            if left:
                raise ValueError(f"swap_hydra_checkpoint: modules of unavailable classes left in '{key}': {left}")
    if not reports:
        raise ValueError(f"swap_hydra_checkpoint: {in_pt} has no 'model' or 'ema' module")
    if not any(r.found for r in reports.values()):
        raise ValueError(f"swap_hydra_checkpoint: no Hydra block found in {in_pt}")
    if target == "bimamba2" and any(len(r) for r in reports.values()) and ckpt.get("optimizer") is not None:
        ckpt["optimizer"] = None
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    with open(out_pt, "wb") as f:
        f.write(buf.getvalue())
    return reports


def cli_main(argv=None) -> int:
    """``yolo-bimamba swap-hydra IN.pt OUT.pt [--target hydra|bimamba2]``."""
    ap = argparse.ArgumentParser(
        prog="yolo-bimamba swap-hydra",
        description="Replace the Hydra blocks of an Ultralytics checkpoint by yolo_bimamba modules "
        "(target 'hydra': same function, fused; 'bimamba2': BiMamba2 blocks for fine-tuning).",
    )
    ap.add_argument("input", help="input .pt checkpoint")
    ap.add_argument("output", help="output .pt checkpoint")
    ap.add_argument("--target", choices=TARGETS, default="hydra")
    args = ap.parse_args(argv)
    try:
        reports = swap_hydra_checkpoint(args.input, args.output, args.target)
    except (ValueError, OSError, pickle.UnpicklingError) as exc:
        print(f"swap-hydra: error: {exc}", file=sys.stderr)
        return 1
    for key, rep in reports.items():
        print(f"[{key}] {rep}")
    print(f"saved {args.output}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(cli_main())
