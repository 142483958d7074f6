"""Launching the Triton kernels with little host work.

Every ``kernel[grid](...)`` goes through Triton's ``JITFunction.run``, which binds and specialises each argument,
builds a cache key, looks the compiled kernel up and checks the kernel's globals, on every launch. At a detection
model's shapes the SSD op is bound by that host work (7-11 launches per fwd+bwd call; ``benchmarks/profile_gpu.py
host`` measures it).

:func:`launch` keeps the compiled kernel Triton returned for the first launch of a specialisation, under a key made
of what Triton specialises on (each tensor's dtype and 16-byte alignment, each integer's size class, divisibility
by 16 and equality to 1, the other arguments' types and values) and the constexpr and launch options, and launches
it itself afterwards, with the call Triton's own launch makes. The key is never coarser than Triton's, so the kernel
launched is the one Triton would pick. ``YOLO_BIMAMBA_DIRECT_LAUNCH=0`` launches everything through Triton;
``YOLO_BIMAMBA_CHECK_LAUNCH=1`` (the GPU tests) also asks Triton for its specialisation on every direct launch and
raises if it differs from the one the kept kernel was compiled for. Only CUDA tensors take the direct path (under
the interpreter every launch goes through Triton), and none while a Triton launch hook is set (profilers).

A kernel's globals are read when it is first compiled; unlike ``JITFunction.run``, a direct launch does not check
that they are unchanged (the package never changes them at run time).
"""
from __future__ import annotations

import torch

from .. import config

_CACHE_MAX = 4096
_kept: dict = {}
counts = {"direct": 0, "triton": 0}  # launches by path, for the tests and the benchmarks


class _Uncached:
    """Marks an argument the key cannot describe (the launch then always goes through Triton)."""


_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_SCALAR_TYPES = (int, float, bool, type(None))  # never tensors: no isinstance check for them


def _arg_key(a):
    """What Triton may specialise an argument on (exact types first: this runs for every argument of every launch)."""
    cls = type(a)
    if cls in _TENSOR_TYPES or (cls not in _SCALAR_TYPES and isinstance(a, torch.Tensor)):
        return a.dtype, not a.data_ptr() & 15
    if cls is int:
        return a == 1, not a & 15, -(1 << 31) <= a < (1 << 31), a < (1 << 63)
    if cls is float:
        return float
    if cls is bool or a is None:
        return a
    return _Uncached


def _triton_specialization(fn, device, args, kwargs):
    """Triton's own (signature, specialisation) of a launch: the check mode's reference."""
    binder = fn.device_caches[device][4]
    _bound, spec, _options = binder(*args, **kwargs)
    return [tuple(s) if isinstance(s, (list, tuple)) else s for s in spec]


def _hook_active(hook) -> bool:
    # None (older Triton) or an empty HookChain (Triton >= 3.4: always present, holding the hooks added)
    return hook is not None and (not hasattr(hook, "calls") or bool(hook.calls))


_runtime_knobs = []  # triton.knobs.runtime, looked up once


def _hooks_set() -> bool:
    """A launch hook is set (Triton's profilers): such launches go through Triton, which calls it."""
    if not _runtime_knobs:
        import triton

        _runtime_knobs.append(getattr(getattr(triton, "knobs", None), "runtime", None))
    rt = _runtime_knobs[0]
    return rt is None or _hook_active(rt.launch_enter_hook) or _hook_active(rt.launch_exit_hook)


def cache_key(fn, device, args, kwargs):
    """The key of a kept compiled kernel: the kernel by identity (hashing a JITFunction hashes its source key:
    microseconds per launch; the entry holds the function, so its id is not reused while the entry lives), the
    device, the constexpr and launch options, and what Triton specialises each argument on; None where an argument
    cannot be described (such launches always go through Triton)."""
    sig = tuple(map(_arg_key, args))
    return None if _Uncached in sig else (id(fn), device, tuple(kwargs.items()), sig)


def launch(fn, grid, args, kwargs):
    """``fn[grid](*args, **kwargs)`` (``kwargs``: constexpr arguments and launch options such as num_warps), with the
    compiled kernel launched directly once Triton has compiled it for this specialisation."""
    key = None
    if config.DIRECT_LAUNCH and args and isinstance(args[0], torch.Tensor) and args[0].is_cuda:
        device = torch.cuda.current_device()
        key = cache_key(fn, device, args, kwargs)
        if key is not None:
            kept = _kept.get(key)
            if kept is not None and kept[0] is fn and not _hooks_set():
                _fn, kernel, tail, spec = kept
                if config.CHECK_LAUNCH and _triton_specialization(fn, device, args, kwargs) != spec:
                    raise RuntimeError(f"direct launch of {fn.__name__}: Triton specialises these arguments "
                                       f"differently from the kept kernel")
                g = tuple(grid) + (1, 1)
                stream = torch._C._cuda_getCurrentRawStream(device)  # what Triton's driver launches on
                kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, None, None, None,
                           *args, *tail)
                counts["direct"] += 1
                return kernel
    kernel = fn[grid](*args, **kwargs)
    counts["triton"] += 1
    if key is not None and kernel is not None and not hasattr(kernel, "result"):
        if len(_kept) >= _CACHE_MAX:
            _kept.clear()
        spec = _triton_specialization(fn, device, args, kwargs) if config.CHECK_LAUNCH else None
        _kept[key] = (fn, kernel, _tail(fn, len(args), kwargs), spec)
    return kernel


def _tail(fn, npos, kwargs):
    """The values of the parameters after the positional ones, in the kernel's order (Triton's launcher takes every
    parameter, the constexprs too): from ``kwargs``, else the parameter's default."""
    out = []
    for p in fn.params[npos:]:
        if p.name in kwargs:
            out.append(kwargs[p.name])
        elif p.has_default:
            out.append(p.default)
        else:
            raise TypeError(f"{fn.__name__}: no value for parameter {p.name}")
    return tuple(out)
