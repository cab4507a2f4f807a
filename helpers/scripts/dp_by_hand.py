"""Data parallelism by hand, four ways, against DistributedDataParallel (chapter 8).

Every rank builds the same MLP, takes its own slice of one global batch and averages the
gradients over the ranks in one of five ways:

- ``ddp``: ``DistributedDataParallel`` with buckets of ``--bucket-mb``, the reference;
- ``per_param``: after backward, one blocking all-reduce per gradient;
- ``flat``: after backward, every gradient copied into one flat buffer, one all-reduce;
- ``overlap``: a ``register_post_accumulate_grad_hook`` on each parameter starts an async
  all-reduce of that gradient the moment it is complete, while backward goes on with the
  earlier layers; the step waits for them all, then divides;
- ``bucketed``: the same, but gradients are packed into buckets of about ``--bucket-mb``
  (in the order backward produces them) and each full bucket is all-reduced at once.

Recorded for each way: the averaged gradients of one step (the notebook compares them with
DDP's), the step time (blocks of steps; the slowest rank counts, as in chapter 4's
scaling.py), the bytes and calls handed to all-reduce per step and, over a few instrumented
steps, when each all-reduce was in flight against when backward ran (the ranks' own clocks;
on CUDA, the profiler's kernel timeline). Rank 0 also writes a profiler trace of one bucketed
step with labelled ranges (``--trace``), which chapter 8 reads back.

    torchrun --standalone --nproc-per-node=2 dp_by_hand.py --out /tmp/dp
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

from helpers.comm_overlap import (
    allreduce_rounding_bound,
    hidden_communication,
    kernel_spans,
    labelled,
    plan_buckets,
)
from helpers.models import make_mlp
from helpers.scripts.common import (
    Context,
    exit_now,
    log,
    parser,
    run_alone,
    write_result,
)

WAYS = ("ddp", "per_param", "flat", "overlap", "bucketed")
#: The host-clock phases of an instrumented step; "compute" is backward up to its last gradient.
PHASES = ("forward", "backward", "compute", "wait")


class Comm:
    """All-reduce (a sum) that counts bytes and calls, and records when each was in flight (chapter 8)."""

    def __init__(self) -> None:
        self.bytes = self.calls = 0
        self.spans: list[tuple[float, float]] = []
        self.record = False  # host-clock spans; on CUDA the profiler's kernels are used instead

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False) -> Any:
        """dist.all_reduce(tensor), counted (chapter 8)."""
        self.bytes += tensor.numel() * tensor.element_size()
        self.calls += 1
        start = time.perf_counter()
        work = dist.all_reduce(tensor, async_op=async_op)
        if self.record and async_op:  # the future completes on the backend's thread
            work.get_future().then(lambda _: self.spans.append((start, time.perf_counter())))
        elif self.record:
            self.spans.append((start, time.perf_counter()))
        return work


class PerParameter:
    """(a) After backward: one blocking all-reduce per gradient, then divide (chapter 8)."""

    def __init__(self, model: nn.Module, comm: Comm) -> None:
        self.params, self.comm = list(model.parameters()), comm

    def finish(self) -> None:
        for p in self.params:
            self.comm.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


class Flat:
    """(b) After backward: all gradients in one flat buffer, one all-reduce, copied back (chapter 8)."""

    def __init__(self, model: nn.Module, comm: Comm) -> None:
        self.params, self.comm = list(model.parameters()), comm

    def finish(self) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        self.comm.all_reduce(flat)
        flat /= dist.get_world_size()
        for p, piece in zip(self.params, flat.split([p.numel() for p in self.params])):
            p.grad.copy_(piece.view_as(p))


class Overlapped:
    """(c) Each gradient's async all-reduce starts from its post-accumulate hook, during backward (chapter 8)."""

    def __init__(self, model: nn.Module, comm: Comm) -> None:
        self.comm, self.pending = comm, []
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self.ready)

    def ready(self, p: torch.Tensor) -> None:
        # p.grad holds this step's whole gradient now: send it while backward goes on
        self.pending.append((p, self.comm.all_reduce(p.grad, async_op=True)))

    def finish(self) -> None:
        for p, work in self.pending:
            work.wait()  # without it the gradient may still be in flight
            p.grad /= dist.get_world_size()  # all_reduce summed: divide once
        self.pending.clear()


class Bucketed:
    """(d) Gradients packed into buckets in backward's order; a bucket's all-reduce starts when it is full (chapter 8)."""

    def __init__(self, model: nn.Module, comm: Comm, bucket_bytes: int) -> None:
        params = list(model.parameters())[::-1]  # backward produces the last layer's first
        plan = plan_buckets([p.numel() * p.element_size() for p in params], bucket_bytes)
        self.buckets = [[params[i] for i in bucket] for bucket in plan]
        self.comm, self.works = comm, []
        self.missing = [len(b) for b in self.buckets]
        for i, bucket in enumerate(self.buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(partial(self.ready, i))

    def ready(self, i: int, p: torch.Tensor) -> None:
        self.missing[i] -= 1
        if self.missing[i] == 0:  # the bucket's last gradient is in: pack it and send it
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            self.works.append((i, flat, self.comm.all_reduce(flat, async_op=True)))

    def finish(self) -> None:
        if len(self.works) != len(self.buckets):
            raise RuntimeError("a bucket never filled: a parameter got no gradient this step")
        for i, flat, work in self.works:
            work.wait()
            flat /= dist.get_world_size()
            pieces = flat.split([q.numel() for q in self.buckets[i]])
            for q, piece in zip(self.buckets[i], pieces):
                q.grad.copy_(piece.view_as(q))
        self.works.clear()
        self.missing = [len(b) for b in self.buckets]


def counting_ddp_hook(comm, bucket):  # noqa: ANN001, ANN201 - DDP checks these annotations
    """DDP's own all-reduce hook, counted and timed like the hand-made ways (chapter 8)."""
    buffer = bucket.buffer()
    comm.bytes += buffer.numel() * buffer.element_size()
    comm.calls += 1
    start = time.perf_counter()
    fut = default_hooks.allreduce_hook(None, bucket)  # divides by the world size, then sums

    def done(f: torch.futures.Future) -> torch.Tensor:
        if comm.record:
            comm.spans.append((start, time.perf_counter()))
        return f.value()

    return fut.then(done)


def build(way: str, ctx: Context, args: argparse.Namespace, start: dict) -> tuple[nn.Module, Any]:
    """The model (same weights on every rank) and the way it averages gradients (chapter 8)."""
    model = make_mlp((args.width,) * args.depth + (1,)).to(ctx.device)
    model.load_state_dict(start)
    comm = Comm()
    bucket_bytes = int(args.bucket_mb * 2**20)
    if way == "ddp":
        ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
        net = DDP(model, device_ids=ids, bucket_cap_mb=args.bucket_mb)
        net.register_comm_hook(state=comm, hook=counting_ddp_hook)
        return net, (comm, None)
    ways: dict[str, Callable[[], Any]] = {
        "per_param": lambda: PerParameter(model, comm),
        "flat": lambda: Flat(model, comm),
        "overlap": lambda: Overlapped(model, comm),
        "bucketed": lambda: Bucketed(model, comm, bucket_bytes),
    }
    return model, (comm, ways[way]())


def batch(ctx: Context, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of one global batch (chapter 8)."""
    g = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.per_rank_batch * ctx.world_size, args.width, generator=g)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    rows = slice(ctx.rank * args.per_rank_batch, (ctx.rank + 1) * args.per_rank_batch)
    return x[rows].to(ctx.device), y[rows].to(ctx.device)


def train_step(net: nn.Module, averager: Any, opt: torch.optim.Optimizer, x, y) -> dict:  # noqa: ANN001
    """zero_grad, forward, backward, average, SGD step; the host times of each phase (chapter 8)."""
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.binary_cross_entropy_with_logits(net(x), y)
    t1 = time.perf_counter()
    loss.backward()  # DDP and the hooks start all-reduces in here
    t2 = time.perf_counter()
    if averager is not None:
        averager.finish()
    t3 = time.perf_counter()
    opt.step()
    return {"forward": (t0, t1), "backward": (t1, t2), "wait": (t2, t3), "end": time.perf_counter()}


def sync(device: torch.device) -> None:
    """Wait for queued GPU work; nothing to wait for on CPU (chapter 8)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class GradClock:
    """When the last gradient of a step was accumulated: backward's compute ends there (chapter 8)."""

    def __init__(self, model: nn.Module) -> None:
        self.last = 0.0
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self.tick)

    def tick(self, p: torch.Tensor) -> None:
        self.last = time.perf_counter()


@dataclass
class Run:
    """One way of averaging, ready to train: model, its counter, its averager, its optimizer (chapter 8)."""

    net: nn.Module
    comm: Comm
    averager: Any
    opt: torch.optim.Optimizer
    clock: GradClock


def time_blocks(ctx: Context, args: argparse.Namespace, runs: dict[str, Run], xy: tuple) -> dict:
    """Seconds per step of each way, in blocks taken in turn; the slowest rank counts (chapter 8)."""
    per_step: dict[str, list[float]] = {w: [] for w in runs}
    for _ in range(args.blocks):
        for way, r in runs.items():  # in turn, so that a slow spell of the machine hits them all
            dist.barrier()
            sync(ctx.device)
            start = time.perf_counter()
            for _ in range(args.steps):
                train_step(r.net, r.averager, r.opt, *xy)
            sync(ctx.device)
            elapsed = torch.tensor([time.perf_counter() - start], device=ctx.device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            per_step[way].append(elapsed.item() / args.steps)
    return per_step


def instrumented_steps(ctx: Context, r: Run, xy: tuple, steps: int) -> list[dict]:
    """A few steps with every all-reduce's time in flight against backward's (chapter 8)."""
    out = []
    for _ in range(steps):
        dist.barrier()
        r.comm.spans, r.comm.bytes, r.comm.calls = [], 0, 0
        if ctx.device.type == "cuda":  # host clocks do not see the GPU: read its kernels
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                train_step(r.net, r.averager, r.opt, *xy)
                sync(ctx.device)
            comm, compute = kernel_spans(prof.events())
            t0 = min((s for s, _ in comm + compute), default=0.0)
            comm = [(s - t0, e - t0) for s, e in comm]
            phases = {"compute": [(s - t0, e - t0) for s, e in compute]}
        else:
            r.comm.record = True
            times = train_step(r.net, r.averager, r.opt, *xy)
            r.comm.record = False
            times["compute"] = (times["backward"][0], r.clock.last)  # backward until its last grad
            t0 = times["forward"][0]
            comm = [(s - t0, e - t0) for s, e in r.comm.spans]
            phases = {k: [(times[k][0] - t0, times[k][1] - t0)] for k in PHASES}
        sent = {"bytes": r.comm.bytes, "calls": r.comm.calls}
        out.append(
            {"comm": comm, **phases, **sent, **hidden_communication(comm, phases["compute"])}
        )
    return out


def traced_step(ctx: Context, r: Run, xy: tuple, path: str | None) -> None:
    """One step with labelled ranges on every rank (it communicates); rank 0 saves the trace at `path` (chapter 8)."""
    activities = [ProfilerActivity.CPU]
    if ctx.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    x, y = xy
    with profile(activities=activities) as prof:
        with labelled("step", ctx.device):
            r.opt.zero_grad(set_to_none=True)
            with labelled("forward", ctx.device):
                loss = nn.functional.binary_cross_entropy_with_logits(r.net(x), y)
            with labelled("backward", ctx.device):
                loss.backward()  # the buckets' all-reduces start in here, on the backend's thread
            with labelled("communication wait", ctx.device):
                r.averager.finish()
            with labelled("optimizer step", ctx.device):
                r.opt.step()
        sync(ctx.device)
    if path is not None:
        prof.export_chrome_trace(path)


def summary(per_step: list[float]) -> dict[str, float]:
    """Median and IQR of a list of step times (chapter 8)."""
    q1, _, q3 = statistics.quantiles(per_step, n=4) if len(per_step) > 1 else (0, 0, 0)
    return {"step median s": statistics.median(per_step), "step IQR s": q3 - q1}


def build_parser() -> argparse.ArgumentParser:
    """This script's options (chapter 8)."""
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--per-rank-batch", type=int, default=64)
    p.add_argument("--bucket-mb", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=4, help="steps per timed block")
    p.add_argument("--blocks", type=int, default=5, help="timed blocks per way")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--instrumented", type=int, default=3, help="steps with in-flight times")
    p.add_argument("--trace", action="store_true", help="rank 0 writes OUT/trace_rank0.json")
    return p


def run(ctx: Context, args: argparse.Namespace) -> None:
    """The five ways: gradients of one step, step times, bytes, overlap; results to args.out (chapter 8)."""
    start = make_mlp((args.width,) * args.depth + (1,), seed=args.seed).state_dict()
    xy = batch(ctx, args)
    runs, result = {}, {"world_size": ctx.world_size, "device": ctx.device.type, "ways": {}}
    averaged: dict[str, list[torch.Tensor]] = {}
    for way in WAYS:
        net, (comm, averager) = build(way, ctx, args, start)
        module = net.module if way == "ddp" else net
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)
        r = Run(net, comm, averager, opt, GradClock(module))
        net.zero_grad(set_to_none=True)
        nn.functional.binary_cross_entropy_with_logits(net(xy[0]), xy[1]).backward()
        if averager is not None:
            averager.finish()
        averaged[way] = [p.grad.detach().clone() for p in module.parameters()]
        result["ways"][way] = {"same on every rank": same_on_every_rank(ctx, module)}
        for _ in range(args.warmup):
            train_step(r.net, r.averager, r.opt, *xy)
        runs[way] = r
    bound = allreduce_rounding_bound(abs_grad_sum(ctx, args, start, xy), ctx.world_size)
    for way, got in averaged.items():
        result["ways"][way] |= against_ddp(got, averaged["ddp"], bound)
    del averaged
    for way, per_step in time_blocks(ctx, args, runs, xy).items():
        result["ways"][way] |= {"step times s": per_step, **summary(per_step)}
    for way, r in runs.items():
        steps = instrumented_steps(ctx, r, xy, args.instrumented)
        result["ways"][way] |= {"instrumented": steps, "bytes per step": steps[-1]["bytes"]}
        result["ways"][way]["calls per step"] = steps[-1]["calls"]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.trace:  # every rank runs the step; rank 0 keeps the trace
        path = str(args.out / "trace_rank0.json") if ctx.is_main else None
        traced_step(ctx, runs["bucketed"], xy, path)
    dist.barrier()
    result["parameters"] = sum(p.numel() for p in runs["ddp"].net.parameters())
    result["threads"] = torch.get_num_threads()
    write_result(args.out, ctx, result)
    ddp, best = result["ways"]["ddp"], result["ways"]["bucketed"]
    log(
        ctx,
        f"{ctx.world_size} rank(s): DDP {ddp['step median s'] * 1e3:.2f} ms/step, bucketed by "
        f"hand {best['step median s'] * 1e3:.2f} ms/step; results in {args.out}",
    )


def same_on_every_rank(ctx: Context, model: nn.Module) -> bool:
    """Whether every rank holds exactly rank 0's averaged gradients (chapter 8)."""
    mine = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    first = mine.clone()
    dist.broadcast(first, src=0)
    same = torch.tensor([float(torch.equal(mine, first))], device=ctx.device)
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    return bool(same.item())


def abs_grad_sum(ctx: Context, args: argparse.Namespace, start: dict, xy: tuple) -> list:
    """Per element, the sum over the ranks of |each rank's own gradient| (chapter 8)."""
    model = make_mlp((args.width,) * args.depth + (1,)).to(ctx.device)
    model.load_state_dict(start)
    nn.functional.binary_cross_entropy_with_logits(model(xy[0]), xy[1]).backward()
    abs_sum = [p.grad.abs() for p in model.parameters()]
    for t in abs_sum:
        dist.all_reduce(t)
    return abs_sum


def against_ddp(got: list[torch.Tensor], ddp: list[torch.Tensor], bound: list) -> dict:
    """Largest |gradient - DDP's|, and whether every element is within the rounding bound (chapter 8)."""
    diff = [(g - r).abs() for g, r in zip(got, ddp)]
    return {
        "max |grad - DDP|": max(d.max().item() for d in diff),
        "within the bound": all(bool((d <= b).all()) for d, b in zip(diff, bound)),
    }


def main(argv: list[str] | None = None) -> None:
    run_alone(build_parser(), run, argv)


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
