"""Tests of the non-finite step guard's optimizer step itself, on CPU: fp16 with a GradScaler, gradient clipping,
and DDP (two gloo processes take the same decision). The shared fixtures are in guard_harness.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from yolo_bimamba import guard
from guard_harness import BASE, REPO, env  # noqa: F401 (env: the module's fixture)


# ----------------------------------------------------------------------------- the step itself: fp16, clip, DDP
def _holder(model, optimizer, scaler, ema=None, **args):
    """A trainer as optimizer_step sees it: the real BaseTrainer.optimizer_step (patched) is called on an object
    carrying real model / optimizer / GradScaler / ModelEMA, without building datasets."""
    a = dict(guard.GUARD_DEFAULTS, **args)
    return SimpleNamespace(args=SimpleNamespace(**a), model=model, optimizer=optimizer, scaler=scaler, ema=ema,
                           device=torch.device("cpu"), epoch=0)


def test_fp16_gradscaler_skip_counted_once_scale_adapts_ema_untouched(env):
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.utils.torch_utils import ModelEMA

    def make():
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
        return net, torch.optim.SGD(net.parameters(), lr=0.1), torch.amp.GradScaler("cpu", init_scale=1024.0)

    x = torch.randn(8, 4)
    results = {}
    for mode in ("guard", "ultralytics"):
        net, opt, scaler = make()
        ema = ModelEMA(net)
        t = _holder(net, opt, scaler, ema, nan_guard=(mode == "guard"))
        guard._CALLBACKS["on_train_batch_start"](t)  # BN snapshot, as at on_train_batch_start
        w0 = [p.detach().clone() for p in net.parameters()]
        e0 = {k: v.clone() for k, v in ema.ema.state_dict().items()}
        scaler.scale(net(x).square().mean()).backward()
        net[0].weight.grad[0, 0] = float("inf")  # the scaler sees it in unscale_
        BaseTrainer.optimizer_step(t)
        assert all(torch.equal(a, b) for a, b in zip(w0, net.parameters()))  # the scaler skipped optimizer.step
        assert scaler.get_scale() == 512.0  # and backed off as usual
        results[mode] = ema.updates
        if mode == "guard":
            assert all(torch.equal(e0[k], v) for k, v in ema.ema.state_dict().items())  # EMA untouched
            assert t.guard.skipped == 1 and t.guard.amp_skipped == 1 and t.guard.consecutive == 1
            assert torch.equal(net[1].running_mean, e0["1.running_mean"])  # BN restored
            guard._CALLBACKS["on_train_batch_start"](t)
            scaler.scale(net(x).square().mean()).backward()  # a good step afterwards
            BaseTrainer.optimizer_step(t)
            assert not all(torch.equal(a, b) for a, b in zip(w0, net.parameters()))
            assert t.guard.steps == 2 and t.guard.skipped == 1 and t.guard.consecutive == 0 and ema.updates == 1
    assert results == {"guard": 0, "ultralytics": 1}  # Ultralytics updates the EMA even on a skipped fp16 step


@pytest.mark.parametrize("guard_on", [True, False])
@pytest.mark.parametrize("clip", [5.0, 0.0])
def test_clip_max_norm_exact(env, guard_on, clip):
    from ultralytics.engine.trainer import BaseTrainer

    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=1.0)
    t = _holder(torch.nn.ParameterList([p]), opt, torch.amp.GradScaler("cpu", enabled=False), nan_guard=guard_on,
                clip_max_norm=clip)
    p.grad = torch.tensor([12.0, 16.0, 0.0, 0.0])  # norm 20
    BaseTrainer.optimizer_step(t)
    expected = clip if clip > 0 else 20.0  # clip_max_norm=0 disables clipping
    assert torch.linalg.vector_norm(p.detach()).item() == pytest.approx(expected, rel=1e-6)


DDP_SCRIPT = """
import os, sys, json
from types import SimpleNamespace
import torch, torch.distributed as dist, torch.multiprocessing as mp
sys.path.insert(0, {repo!r})

# 1) bootstrap as in the DDP worker script written by Ultralytics' generate_ddp_file: 8.4 unpickles the parent's
#    callbacks (the guard's install it) before building the trainer from the parent's args; 8.3 only runs the
#    script's own top level (the guard prepends an install there).
import runpy
from pathlib import Path
from ultralytics.utils import DEFAULT_CFG_DICT
from ultralytics.cfg import get_cfg
assert "nan_guard" not in DEFAULT_CFG_DICT
ddp_file = Path(sys.argv[3])
if ddp_file.with_suffix(".pt").exists():  # 8.4
    from ultralytics.utils.patches import torch_load
    overrides = torch_load(ddp_file.with_suffix(".pt"), map_location="cpu")["args"]
    assert "nan_guard" in DEFAULT_CFG_DICT  # installed by unpickling the callbacks alone
    runpy.run_path(str(ddp_file), run_name="ddp_probe")
else:  # 8.3: the args are a literal in the script
    overrides = runpy.run_path(str(ddp_file), run_name="ddp_probe")["overrides"]
cfg = DEFAULT_CFG_DICT.copy()
cfg.update(save_dir="")
args = get_cfg(cfg, overrides)
assert args.nan_guard is False and args.clip_max_norm == 2.0
from ultralytics.engine.trainer import BaseTrainer
assert getattr(BaseTrainer.optimizer_step, "_yolo_bimamba_guard", False)
import yolo_bimamba.guard as guard
from ultralytics.utils.torch_utils import ModelEMA

# 2) two forked gloo ranks with a DDP model

def worker(rank, world, init, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    res = dict(flag_any=guard.any_rank(torch.tensor(rank == 1)), flag_none=guard.any_rank(torch.tensor(False)))
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ema = ModelEMA(ddp)
    args = SimpleNamespace(**dict(guard.GUARD_DEFAULTS, nan_guard=True))  # a stock model: the guard is opted in
    t = SimpleNamespace(args=args, model=ddp, optimizer=opt, ema=ema,
                        scaler=torch.amp.GradScaler("cpu", enabled=False), device=torch.device("cpu"), epoch=0)
    x = torch.randn(8, 4) + rank
    w0 = [p.detach().clone() for p in net.parameters()]
    guard._CALLBACKS["on_train_batch_start"](t)
    ddp(x).square().mean().backward()  # gradients all-reduced by DDP
    if rank == 1:
        net[0].weight.grad[0, 0] = float("nan")  # only rank 1's local gradient is bad
    BaseTrainer.optimizer_step(t)
    res["unchanged_after_bad"] = all(torch.equal(a, b) for a, b in zip(w0, net.parameters()))
    res["skipped"] = t.guard.skipped
    res["ema_updates"] = ema.updates
    guard._CALLBACKS["on_train_batch_start"](t)
    ddp(x).square().mean().backward()
    BaseTrainer.optimizer_step(t)
    res["changed_after_good"] = not all(torch.equal(a, b) for a, b in zip(w0, net.parameters()))
    res["steps"] = t.guard.steps
    res["w"] = [p.detach().sum().item() for p in net.parameters()]
    json.dump(res, open(out + str(rank), "w"))
    dist.destroy_process_group()

if __name__ == "__main__":
    init, out = sys.argv[1], sys.argv[2]
    mp.start_processes(worker, args=(2, init, out), nprocs=2, join=True, start_method="fork")
"""


def test_ddp_worker_bootstrap_and_all_ranks_take_the_same_decision(env, tmp_path):
    """(1) The state file written by Ultralytics' own generate_ddp_file, loaded in a fresh process, installs the guard
    before the worker's trainer config is validated. (2) Two gloo processes with a DDP model: only rank 1's gradient
    is non-finite, both ranks skip the step."""
    import json

    from ultralytics.utils.callbacks import get_default_callbacks
    from ultralytics.utils.dist import generate_ddp_file

    stand_in = SimpleNamespace(callbacks=get_default_callbacks(), model=torch.nn.Linear(2, 2), hub_session=None,
                               args=SimpleNamespace(**{**BASE, **guard.GUARD_DEFAULTS, "model": env.model}))
    guard.attach(stand_in)  # what the patched BaseTrainer.__init__ does
    stand_in.args.nan_guard, stand_in.args.clip_max_norm = False, 2.0
    file = Path(generate_ddp_file(stand_in))
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT.format(repo=str(REPO)))
    # the worker must install the guard by itself: with the package installed, its .pth autoload would already have
    # done so on `import ultralytics`, so it is switched off here to test the bootstrap path on its own
    environ = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "0", "YOLO_BIMAMBA_AUTOLOAD": "0"}
    environ.pop("RANK", None)
    environ.pop("LOCAL_RANK", None)
    try:
        subprocess.run([sys.executable, str(script), str(tmp_path / "init"), str(tmp_path / "res"), str(file)],
                       check=True, env=environ, timeout=300)
    finally:
        file.unlink(missing_ok=True)
        file.with_suffix(".pt").unlink(missing_ok=True)
    r = [json.loads((tmp_path / f"res{k}").read_text()) for k in (0, 1)]
    for x in r:
        assert x["flag_any"] is True and x["flag_none"] is False
        assert x["unchanged_after_bad"] and x["skipped"] == 1 and x["ema_updates"] == 0
        assert x["changed_after_good"] and x["steps"] == 2
    assert r[0]["w"] == r[1]["w"]  # ranks stay in sync
