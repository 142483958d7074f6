"""The chunk-parallel forward of benchmarks/chunk_parallel_study.py computes the op's function (so that its GPU
timings compare like with like): under the Triton interpreter, against the PyTorch op in float64."""
import pytest
import torch

from benchmark_script import load
from yolo_bimamba.ops import bi_ssd

study = load("chunk_parallel_study")


@pytest.mark.parametrize("direction", ["both", "forward"])
@pytest.mark.parametrize("b,L,h,p,g,n,block_q", [
    (2, 150, 4, 16, 2, 32, 64),  # L not a multiple of the chunk, 2 groups of 2 heads
    (1, 7, 2, 32, 1, 16, 64),  # L below one chunk
    (1, 129, 2, 16, 1, 16, 128),  # one row past a chunk of 128, two sub-blocks
    (1, 300, 2, 16, 1, 16, 256),  # chunks of 256 (Mamba2's), four sub-blocks, the second chunk partial
])
def test_chunk_parallel_forward_equals_the_op(direction, b, L, h, p, g, n, block_q):
    inp = study.inputs(dict(b=b, l=L, h=h, p=p, g=g, n=n), torch.float32, "cpu")
    args = [inp[k] for k in ("x", "dt", "A", "B", "C")]
    for D in (None, inp["D"]):
        got = study.chunk_parallel_forward(*args, direction=direction, D=D, dt_bias=inp["dt_bias"], dt_softplus=True,
                                           block_q=block_q)
        want = bi_ssd(*[t.double() for t in args], direction=direction, backend="torch",
                      D=None if D is None else D.double(), dt_bias=inp["dt_bias"].double(), dt_softplus=True)
        assert torch.isfinite(got).all()
        assert (got.double() - want).norm() / want.norm() < 1e-5


def test_chunk_parallel_forward_rejects_what_it_does_not_compute():
    inp = study.inputs(dict(b=1, l=8, h=2, p=16, g=1, n=16), torch.float32, "cpu")
    args = [inp[k] for k in ("x", "dt", "A", "B", "C")]
    with pytest.raises(ValueError, match="direction"):
        study.chunk_parallel_forward(*args, direction="backward")
    with pytest.raises(ValueError, match="block_q"):
        study.chunk_parallel_forward(*args, block_q=96)
