"""Data parallelism by hand, four ways, against DistributedDataParallel (chapter 8).

Every rank builds the same MLP, takes its own slice of one global batch and averages the
gradients over the ranks in one of five ways:

- ``ddp``: ``DistributedDataParallel`` with buckets of ``--bucket-mb``, the reference;
- ``per_param``: after backward, one blocking all-reduce per gradient;
- ``flat``: after backward, every gradient copied into one flat buffer, one all-reduce;
- ``overlap``: a ``register_post_accumulate_grad_hook`` on each parameter starts an async
  all-reduce of that gradient the moment it is complete, while backward goes on with the
  earlier layers; the step waits for them all, then divides;
- ``bucketed``: the same, but gradients are packed into buckets of about ``--bucket-mb`` MiB
  (in the order backward produces them) and the buckets are all-reduced in order, each once
  it and every bucket before it are full (DDP's rule: every rank issues the same collectives
  in the same order).

Recorded for each way: the averaged gradients of one step (the notebook compares them with
DDP's), the step time (blocks of steps; the slowest rank counts, as in chapter 4's
scaling.py), the bytes and calls handed to all-reduce per step and, over a few instrumented
steps, how long backward took (host clock; on CUDA, events on the GPU's stream) and when each
all-reduce was in flight (the ranks' own clocks; on CUDA, the profiler's kernel timeline).
Also: all-reduce times at several sizes (for the alpha-beta fit), the bucketed way's step time
and its wait after backward over a sweep of bucket sizes, DDP's bucket sizes in its first step
and after it rebuilt them, and those of a DDP left at its default cap (a 1 MiB first bucket). Rank 0 writes a profiler trace of one bucketed step with labelled ranges (``--trace``),
which chapter 8 reads back. Every step is labelled (``labelled``: NVTX on CUDA).

With ``--nsys`` the script runs only labelled steps of each way between cudaProfilerStart and
Stop, without torch.profiler (Nsight Systems and the profiler's CUDA tracing clash): run it
under the command ``helpers.comm_overlap.nsys_command`` prints.

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
    capture_range,
    hidden_communication,
    kernel_spans,
    labelled,
    plan_buckets,
    sweep_caps,
)
from helpers.i18n import tr
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
#: All-reduce sizes of the alpha-beta fit, in bytes: 4 KiB to 4 MiB on CPU, 64 KiB to 256 MiB on GPU.
ALLREDUCE_BYTES = {
    "cpu": [1024 * 4**k for k in range(1, 7)],
    "cuda": [1024 * 4**k for k in range(3, 10)],
}
#: All-reduces timed in a row per block of allreduce_times (with --allreduce-blocks, default 7).
ALLREDUCE_CALLS = 20


class Comm:
    """All-reduce (a sum) that counts bytes and calls, and records when each was in flight (chapter 8)."""

    def __init__(self) -> None:
        self.bytes = self.calls = 0
        self.sizes: list[int] = []  # bytes of each call, in the order the calls were made
        self.spans: list[tuple[float, float]] = []
        self.record = False  # host-clock spans; on CUDA the profiler's kernels are used instead

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False) -> Any:
        """dist.all_reduce(tensor), counted (chapter 8)."""
        self.bytes += tensor.numel() * tensor.element_size()
        self.calls += 1
        self.sizes.append(tensor.numel() * tensor.element_size())
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
    """(d) Gradients packed into buckets in backward's order, all-reduced in bucket order (chapter 8)."""

    def __init__(self, model: nn.Module, comm: Comm, bucket_bytes: int) -> None:
        params = list(model.parameters())[::-1]  # backward produces the last layer's first
        plan = plan_buckets([p.numel() * p.element_size() for p in params], bucket_bytes)
        self.buckets = [[params[i] for i in bucket] for bucket in plan]
        self.comm, self.works, self.next = comm, [], 0
        self.missing = [len(b) for b in self.buckets]
        for i, bucket in enumerate(self.buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(partial(self.ready, i))

    def ready(self, i: int, p: torch.Tensor) -> None:
        self.missing[i] -= 1
        # Send full buckets in bucket order, as DDP does: if one rank's graph produced its
        # gradients in another order, sending on completion would pair different buckets.
        while self.next < len(self.buckets) and self.missing[self.next] == 0:
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[self.next]])
            self.works.append((self.next, flat, self.comm.all_reduce(flat, async_op=True)))
            self.next += 1

    def finish(self) -> None:
        if len(self.works) != len(self.buckets):
            raise RuntimeError(tr("a bucket never filled: a parameter got no gradient this step"))
        for i, flat, work in self.works:
            work.wait()
            flat /= dist.get_world_size()
            pieces = flat.split([q.numel() for q in self.buckets[i]])
            for q, piece in zip(self.buckets[i], pieces):
                q.grad.copy_(piece.view_as(q))
        self.works.clear()
        self.missing, self.next = [len(b) for b in self.buckets], 0


def counting_ddp_hook(comm, bucket):  # noqa: ANN001, ANN201 - DDP checks these annotations
    """DDP's own all-reduce hook, counted and timed like the hand-made ways (chapter 8)."""
    buffer = bucket.buffer()
    comm.bytes += buffer.numel() * buffer.element_size()
    comm.calls += 1
    comm.sizes.append(buffer.numel() * buffer.element_size())
    start = time.perf_counter()
    fut = default_hooks.allreduce_hook(None, bucket)  # divides by the world size, then sums

    def done(f: torch.futures.Future) -> torch.Tensor:
        if comm.record:
            comm.spans.append((start, time.perf_counter()))
        return f.value()

    return fut.then(done)


def build(
    way: str,
    ctx: Context,
    args: argparse.Namespace,
    start: dict,
    bucket_bytes: int | None = None,
    ddp_cap_mb: float | None = -1.0,
) -> tuple[nn.Module, Any]:
    """The model (same weights on every rank) and the way it averages gradients (chapter 8)."""
    model = make_mlp((args.width,) * args.depth + (1,)).to(ctx.device)
    model.load_state_dict(start)
    comm = Comm()
    bucket_bytes = bucket_bytes or int(args.bucket_mb * 2**20)  # bucket_cap_mb is in MiB
    if way == "ddp":
        ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
        cap = args.bucket_mb if ddp_cap_mb == -1.0 else ddp_cap_mb  # None: DDP's default
        net = DDP(model, device_ids=ids, bucket_cap_mb=cap)
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


def train_step(net: nn.Module, averager: Any, opt: torch.optim.Optimizer, x, y, clock=None) -> dict:  # noqa: ANN001
    """One labelled step: zero_grad, forward, backward, average, SGD step; host times of each phase (chapter 8)."""
    device = x.device
    with labelled("step", device):  # every step, so that Nsight Systems shows each one
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with labelled("forward", device):
            loss = nn.functional.binary_cross_entropy_with_logits(net(x), y)
        t1 = time.perf_counter()
        with labelled("backward", device):
            if clock is not None:
                clock.start()
            loss.backward()  # DDP and the hooks start all-reduces in here
        t2 = time.perf_counter()
        with labelled("communication wait", device):
            if averager is not None:
                averager.finish()
        t3 = time.perf_counter()
        with labelled("optimizer step", device):
            opt.step()
    return {"forward": (t0, t1), "backward": (t1, t2), "wait": (t2, t3), "end": time.perf_counter()}


def sync(device: torch.device) -> None:
    """Wait for queued GPU work; nothing to wait for on CPU (chapter 8)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class GradClock:
    """When backward started and when its last gradient was accumulated: host clock, or CUDA events (chapter 8)."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.cuda, self.on = device.type == "cuda", False  # on: only in instrumented steps
        self.started: Any = 0.0
        self.last: Any = 0.0
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self.tick)

    def now(self) -> Any:
        """The host clock, or on CUDA an event recorded on the current stream (chapter 8)."""
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # the GPU reaches it once the kernels queued before it have run
        return event

    def start(self) -> None:
        if self.on:
            self.started = self.now()

    def tick(self, p: torch.Tensor) -> None:
        if self.on:
            self.last = self.now()

    def backward_s(self) -> float:
        """Seconds from backward's start to its last gradient (on CUDA, on the GPU) (chapter 8)."""
        if not self.cuda:
            return self.last - self.started
        self.last.synchronize()
        return self.started.elapsed_time(self.last) / 1e3  # ms


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
    """A few steps with backward's time, and every all-reduce's time in flight against backward's (chapter 8)."""
    out = []
    for _ in range(steps):
        dist.barrier()
        r.comm.spans, r.comm.bytes, r.comm.calls, r.comm.sizes = [], 0, 0, []
        if r.clock is not None:
            r.clock.on = True
        if ctx.device.type == "cuda":  # host clocks do not see the GPU: read its kernels
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                train_step(r.net, r.averager, r.opt, *xy, clock=r.clock)
                sync(ctx.device)
            comm, compute = kernel_spans(prof.events())
            t0 = min((s for s, _ in comm + compute), default=0.0)
            comm = [(s - t0, e - t0) for s, e in comm]
            phases = {"compute": [(s - t0, e - t0) for s, e in compute]}
        else:
            r.comm.record = True
            times = train_step(r.net, r.averager, r.opt, *xy, clock=r.clock)
            r.comm.record = False
            times["compute"] = (times["backward"][0], r.clock.last)  # backward until its last grad
            t0 = times["forward"][0]
            comm = [(s - t0, e - t0) for s, e in r.comm.spans]
            phases = {k: [(times[k][0] - t0, times[k][1] - t0)] for k in PHASES}
        sent = {"bytes": r.comm.bytes, "calls": r.comm.calls, "sizes": list(r.comm.sizes)}
        if r.clock is not None:
            r.clock.on = False
            sent["backward s"] = r.clock.backward_s()
        out.append(
            {"comm": comm, **phases, **sent, **hidden_communication(comm, phases["compute"])}
        )
    return out


def traced_step(ctx: Context, r: Run, xy: tuple, path: str | None) -> None:
    """One step with labelled ranges on every rank (it communicates); rank 0 saves the trace at `path` (chapter 8)."""
    activities = [ProfilerActivity.CPU]
    if ctx.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        train_step(r.net, r.averager, r.opt, *xy)  # labels step, forward, backward, ...
        sync(ctx.device)
    if path is not None:
        prof.export_chrome_trace(path)


def nsys_steps(ctx: Context, args: argparse.Namespace, runs: dict[str, Run], xy: tuple) -> dict:
    """--nsys: labelled steps of every way inside the capture range, no torch.profiler (chapter 8)."""
    sync(ctx.device)
    dist.barrier()
    with capture_range(ctx.device):  # cudaProfilerStart/Stop: nsys records only this
        for way, r in runs.items():
            with labelled(f"way {way}", ctx.device):
                for _ in range(args.steps):
                    train_step(r.net, r.averager, r.opt, *xy)
        sync(ctx.device)
        dist.barrier()  # every rank's steps are inside before the first rank stops the capture
    return {"nsys steps per way": args.steps, "ways": list(runs)}


def allreduce_times(
    ctx: Context, sizes: list[int], blocks: int, calls: int = ALLREDUCE_CALLS
) -> list[dict]:
    """Seconds per all-reduce of a float32 buffer at each size in bytes; the slowest rank counts (chapter 8).

    Fixed counts on every rank, not helpers.timing.benchmark: that adapts how many calls it
    times to each rank's clock, and a collective must be called as often on every rank. Each
    block times `calls` calls in a row and keeps their mean: a block of 20 averages over the
    scheduler's hiccups that made the IQR of 5-call blocks as wide as the median on a loaded
    2-core CPU, so the alpha-beta line can be tested at all.
    """
    bufs = {n: torch.ones(n // 4, device=ctx.device) for n in sizes}
    for buf in bufs.values():
        for _ in range(3):  # warm-up: gloo's and NCCL's first call at a size sets up buffers
            dist.all_reduce(buf)
    per_call: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(blocks):
        for nbytes, buf in bufs.items():  # sizes in turn: a slow spell hits them all
            dist.barrier()
            sync(ctx.device)
            start = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(buf)
            sync(ctx.device)
            took = torch.tensor([(time.perf_counter() - start) / calls], device=ctx.device)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            per_call[nbytes].append(took.item())
    return [{"bytes": n, **summary(times)} for n, times in per_call.items()]


def bucket_sweep(ctx: Context, args: argparse.Namespace, start: dict, xy: tuple) -> list[dict]:
    """The bucketed way's step time and measured wait after backward at several caps (sweep_caps) (chapter 8)."""
    model = make_mlp((args.width,) * args.depth + (1,))
    sizes = [p.numel() * p.element_size() for p in list(model.parameters())[::-1]]
    runs, caps = {}, {}
    for cap in sweep_caps(sizes):
        net, (comm, averager) = build("bucketed", ctx, args, start, bucket_bytes=cap)
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)
        r = Run(net, comm, averager, opt, GradClock(net, ctx.device))
        for _ in range(args.warmup):
            train_step(r.net, r.averager, r.opt, *xy)
        runs[f"cap {cap}"], caps[f"cap {cap}"] = r, (cap, len(averager.buckets))
    sweep_args = argparse.Namespace(blocks=args.sweep_blocks, steps=args.steps)
    rows = []
    for name, per_step in time_blocks(ctx, sweep_args, runs, xy).items():
        cap, buckets = caps[name]
        steps = instrumented_steps(ctx, runs[name], xy, args.sweep_blocks)
        # communication still in flight after backward's last gradient: the step's wait
        wait = statistics.median(s["exposed s"] for s in steps)
        rows.append({"cap bytes": cap, "buckets": buckets, "wait median s": wait, **summary(per_step)})  # fmt: skip
    return rows


def ddp_default_buckets(ctx: Context, args: argparse.Namespace, start: dict, xy: tuple) -> list:
    """Bytes of each all-reduce of a DDP left at its default bucket_cap_mb, after its rebuild (chapter 8)."""
    net, (comm, _) = build("ddp", ctx, args, start, ddp_cap_mb=None)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    for _ in range(2):  # DDP rebuilds its buckets after the first step
        comm.sizes = []
        train_step(net, None, opt, *xy)
    return list(comm.sizes)


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
    p.add_argument("--instrumented", type=int, default=5, help="steps with in-flight times")
    p.add_argument("--trace", action="store_true", help="rank 0 writes OUT/trace_rank0.json")
    p.add_argument("--sweep-blocks", type=int, default=3, help="timed blocks per bucket cap")
    p.add_argument("--allreduce-blocks", type=int, default=7, help="timed blocks per size")
    p.add_argument("--nsys", action="store_true", help="only labelled steps in a capture range")
    return p


def prepare(ctx: Context, args: argparse.Namespace, start: dict, xy: tuple, result: dict) -> dict:
    """Each way built, its first step's gradients checked against DDP's, then warmed up (chapter 8)."""
    runs, averaged = {}, {}
    for way in WAYS:
        net, (comm, averager) = build(way, ctx, args, start)
        module = net.module if way == "ddp" else net
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)
        r = Run(net, comm, averager, opt, GradClock(module, ctx.device))
        net.zero_grad(set_to_none=True)
        nn.functional.binary_cross_entropy_with_logits(net(xy[0]), xy[1]).backward()
        if averager is not None:
            averager.finish()
        averaged[way] = [p.grad.detach().clone() for p in module.parameters()]
        result["ways"][way] = {"same on every rank": same_on_every_rank(ctx, module)}
        result["ways"][way]["first step sizes"] = list(comm.sizes)  # DDP: before its rebuild
        for _ in range(args.warmup):
            train_step(r.net, r.averager, r.opt, *xy)
        runs[way] = r
    bound = allreduce_rounding_bound(abs_grad_sum(ctx, args, start, xy), ctx.world_size)
    for way, got in averaged.items():
        result["ways"][way] |= against_ddp(got, averaged["ddp"], bound)
    return runs


def run(ctx: Context, args: argparse.Namespace) -> None:
    """The five ways: gradients of one step, step times, bytes, overlap, sweeps; results to args.out (chapter 8)."""
    start = make_mlp((args.width,) * args.depth + (1,), seed=args.seed).state_dict()
    xy = batch(ctx, args)
    result = {"world_size": ctx.world_size, "device": ctx.device.type, "ways": {}}
    runs = prepare(ctx, args, start, xy, result)
    if args.nsys:  # what Nsight Systems records; torch.profiler stays off
        write_result(args.out, ctx, result | nsys_steps(ctx, args, runs, xy))
        log(
            ctx,
            tr("{steps} labelled step(s) of each way inside the capture range").format(
                steps=args.steps
            ),
        )
        return
    for way, per_step in time_blocks(ctx, args, runs, xy).items():
        result["ways"][way] |= {"step times s": per_step, **summary(per_step)}
    for way, r in runs.items():
        steps = instrumented_steps(ctx, r, xy, args.instrumented)
        result["ways"][way] |= {"instrumented": steps, "bytes per step": steps[-1]["bytes"]}
        result["ways"][way]["calls per step"] = steps[-1]["calls"]
    sizes = ALLREDUCE_BYTES["cuda" if ctx.device.type == "cuda" else "cpu"]
    result["allreduce"] = allreduce_times(ctx, sizes, args.allreduce_blocks)
    result["bucket sweep"] = bucket_sweep(ctx, args, start, xy)
    result["ddp default cap sizes"] = ddp_default_buckets(ctx, args, start, xy)
    model = runs["ddp"].net.module
    result["backward order bytes"] = [p.numel() * p.element_size() for p in list(model.parameters())[::-1]]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    if args.trace:  # every rank runs the step; rank 0 keeps the trace
        path = str(args.out / "trace_rank0.json") if ctx.is_main else None
        traced_step(ctx, runs["bucketed"], xy, path)
    dist.barrier()
    result["parameters"] = sum(p.numel() for p in model.parameters())
    result["threads"] = torch.get_num_threads()
    write_result(args.out, ctx, result)
    ddp, best = result["ways"]["ddp"], result["ways"]["bucketed"]
    log(ctx, done_line(ctx.world_size, ddp, best, args.out))


def done_line(world: int, ddp: dict, best: dict, out: object) -> str:
    """The last log line: DDP's step time against the buckets by hand, and where the results are (chapter 8)."""
    return tr(
        "{world} rank(s): DDP {ddp:.2f} ms/step, bucketed by hand {best:.2f} ms/step; "
        "results in {out}"
    ).format(
        world=world,
        ddp=ddp["step median s"] * 1e3,
        best=best["step median s"] * 1e3,
        out=out,
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
