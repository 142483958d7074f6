"""Tensor-core tf32 / tf32x3 dot products emulated in the Triton interpreter (CPU).

The interpreter computes every ``tl.dot`` exactly in the operands' dtype, whatever ``input_precision`` says, so
the precision a kernel asks for has no effect on CPU. :func:`emulate_tf32` patches the interpreter's dot so that
fp32 operands are rounded the way an NVIDIA tensor core takes them: ``"tf32"`` rounds both operands to tf32
(10-bit mantissa, round to nearest), ``"tf32x3"`` splits each operand into a tf32 high part and a tf32 low part
and adds the three leading products. Accumulation stays fp32.
"""
from __future__ import annotations

import contextlib

import numpy as np


def to_tf32(a: np.ndarray) -> np.ndarray:
    """fp32 values rounded to the nearest tf32 value (ties away from zero in magnitude, as the hardware's cvt.rna)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return bits.view(np.float32)


def _interpreter_builder():
    from triton.runtime import interpreter

    for obj in vars(interpreter).values():
        if isinstance(obj, type) and hasattr(obj, "create_dot"):
            return obj
    raise RuntimeError("the Triton interpreter has no create_dot: its API changed")


@contextlib.contextmanager
def emulate_tf32():
    from triton._C.libtriton import ir
    from triton.runtime.interpreter import TensorHandle

    builder = _interpreter_builder()
    exact = builder.create_dot
    tf32, tf32x3 = ir.INPUT_PRECISION.TF32, ir.INPUT_PRECISION.TF32x3

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.dtype != np.float32 or input_precision not in (tf32, tf32x3):
            return exact(self, a, b, d, input_precision, max_num_imprecise_acc)
        a_hi, b_hi = to_tf32(a.data), to_tf32(b.data)
        out = np.matmul(a_hi, b_hi, dtype=np.float32)
        if input_precision == tf32x3:
            a_lo, b_lo = to_tf32(a.data - a_hi), to_tf32(b.data - b_hi)
            out = out + np.matmul(a_hi, b_lo, dtype=np.float32) + np.matmul(a_lo, b_hi, dtype=np.float32)
        return TensorHandle(out + d.data, d.dtype.scalar)

    builder.create_dot = create_dot
    try:
        yield
    finally:
        builder.create_dot = exact
