"""A sharded optimizer (ZeRO-1) by hand, against DDP with every rank keeping all of Adam's state (chapter 8).

DDP all-reduces the gradients, so every rank holds the whole averaged gradient, and then every
rank runs the same Adam over every parameter, holding both of its moments for the whole model.
ZeRO-1 (Rajbhandari et al., 2020) cuts that state among the ranks. The parameters and the
gradients live in two flat vectors, padded with zeros to a multiple of the world size, each
parameter (and its gradient) a view of its part; rank r owns the piece ``r*s .. (r+1)*s``. A
rank needs only its own piece of the averaged gradient: one reduce-scatter delivers it, Adam
steps that piece of the parameters in place (its moments exist for the piece only), and one
all-gather, in place, gives every rank the updated parameters. In a ring (what NCCL runs) the
wire carries what DDP's all-reduce does. The naive first try all-reduces the whole gradient and
keeps a piece: half as much again on the wire, for nothing. gloo has no reduce-scatter of its
own: it all-reduces a copy and keeps this rank's piece (pytorch PR #118911), so on gloo ZeRO-1
sends what the naive version does; on CPU processes the script counts the bytes each rank
really wrote to its sockets per step (``helpers.sharding.sent_since``).

Three runs from the same weights on the same batches, one after the other, each measured on its
own: DDP (``gradient_as_bucket_view=True``: the gradients are views of DDP's buckets) with
Adam, ZeRO-1 and the naive ZeRO-1. Recorded per step: the bytes alive before the step, at its
peak and after it (``helpers.sharding.LiveBytes``: the allocator on CUDA, live tensor storages
elsewhere) and what was alive at that peak, the bytes handed to each collective, those a ring
puts on the wire and, on gloo, those really written; and that
DDP's Adam, given ZeRO-1's averaged gradients, ends with the very same parameters.

    torchrun --standalone --nproc-per-node=2 zero1_by_hand.py --out /tmp/zero1
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.comm_overlap import collective, shard_bounds
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
from helpers.scripts.fsdp_vs_ddp import counting_hook
from helpers.sharding import (
    LiveBytes,
    free_now,
    metered_step,
    sent_since,
    wire_bytes,
    zero_formulas,
)

#: The extra run on gloo: ZeRO-1 with ring_reduce_scatter in place of gloo's emulated one.
RING = "ZeRO-1, ring by hand"


def flat_views(params: list[nn.Parameter], padded: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two flat padded vectors, the parameters and their gradients made views of them (chapter 8)."""
    like = params[0]
    flat_param = torch.zeros(padded, dtype=like.dtype, device=like.device)
    flat_grad = torch.zeros_like(flat_param)
    offset = 0
    for p in params:
        n = p.numel()
        flat_param[offset : offset + n].copy_(p.detach().reshape(-1))
        p.data = flat_param[offset : offset + n].view_as(p)  # the old storage is freed
        p.grad = flat_grad[offset : offset + n].view_as(p)  # backward adds into it in place
        offset += n
    return flat_param, flat_grad


def ring_reduce_scatter(flat: torch.Tensor, world: int, rank: int) -> torch.Tensor:
    """This rank's piece of the sum of every rank's `flat`, by a ring of sends (chapter 8).

    W - 1 steps: each rank sends one partial sum to the next rank, receives one from the
    previous, and adds its own piece of that chunk. Each rank sends (W - 1)/W of `flat`.
    """
    pieces = flat.view(world, -1)  # rank r ends with the sum of every rank's pieces[r]
    send_to, recv_from = (rank + 1) % world, (rank - 1) % world
    acc = pieces[(rank - 1) % world].clone()  # sent first: W - 1 hops bring it to rank - 1
    for step in range(world - 1):
        got = torch.empty_like(acc)
        for req in (dist.isend(acc, send_to), dist.irecv(got, recv_from)):
            req.wait()
        acc = got.add_(pieces[(rank - step - 2) % world])  # one more rank's share of this chunk
    return acc


class Zero1Adam:
    """Reduce-scatter the flat gradient, Adam on this rank's piece, all-gather the parameters in place (chapter 8)."""

    def __init__(
        self, params: list[nn.Parameter], lr: float, reduce: str = "reduce_scatter"
    ) -> None:
        # reduce="all_reduce": the naive first try; "ring": ring_reduce_scatter, by hand
        self.params, self.reduce = list(params), reduce
        self.world, rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.start, self.stop, self.size = shard_bounds(self.numel, self.world, rank)
        self.flat_param, self.flat_grad = flat_views(self.params, self.world * self.size)
        self.shard = self.flat_param[self.start : self.stop]  # this rank's parameters, a view
        self.shard.grad = self.flat_grad[self.start : self.stop]
        # foreach=False: the same per-tensor Adam code as DDP's optimizer it is compared with
        self.opt = torch.optim.Adam([self.shard], lr=lr, foreach=False)
        self.handed: dict[str, int] = {}  # bytes of the full buffer given to each collective

    def zero_grad(self) -> None:
        self.flat_grad.zero_()  # not set_to_none: the gradients stay views of the flat vector

    @torch.no_grad()
    def step(self) -> None:
        full = self.flat_grad.numel() * self.flat_grad.element_size()
        if self.reduce == "reduce_scatter":
            mine = torch.empty_like(self.shard)  # gloo cannot reduce-scatter into its own input
            collective("reduce_scatter_single")(mine, self.flat_grad)  # only this rank's piece
            self.shard.grad.copy_(mine)
            free_now(mine)  # at once: gloo's worker thread may hold it a moment longer
        elif self.reduce == "ring":
            mine = ring_reduce_scatter(self.flat_grad, self.world, dist.get_rank())
            self.shard.grad.copy_(mine)
            free_now(mine)
        else:
            dist.all_reduce(self.flat_grad)  # every rank receives every piece, and keeps one
        self.shard.grad.div_(self.world)
        self.opt.step()  # Adam's moments exist for this piece only
        # in place: this rank's piece already sits in its slot of the output
        collective("all_gather_single")(self.flat_param, self.shard)
        self.handed = {"reduce_scatter" if self.reduce == "ring" else self.reduce: full}
        self.handed["all_gather"] = full


def state_bytes(opt: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of an optimizer's state tensors: Adam's two moments, and its step counters (chapter 8)."""
    moments = counters = 0
    for state in opt.state.values():
        for key, t in state.items():
            if torch.is_tensor(t):
                n = t.numel() * t.element_size()
                if key in ("exp_avg", "exp_avg_sq"):
                    moments += n
                else:
                    counters += n
    return {"moments": moments, "step counters": counters}


def build_parser() -> argparse.ArgumentParser:
    """This script's options (chapter 8)."""
    p = parser(__doc__.splitlines()[0])
    # 4,200 parameters = 5 x 840, and 840 = lcm(1..8): every world size up to 8 needs no padding
    p.add_argument("--sizes", default="32,44,56,4", help="layer sizes of the MLP")
    p.add_argument("--per-rank-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-2)
    return p


def batch(
    ctx: Context, args: argparse.Namespace, sizes: tuple, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of step `step`'s global batch, the same in every run (chapter 8)."""
    g = torch.Generator().manual_seed(args.seed + 100 + step)
    x = torch.randn(args.per_rank_batch * ctx.world_size, sizes[0], generator=g)
    y = (x.sum(dim=1, keepdim=True) > 0).float().expand(-1, sizes[-1])
    rows = slice(ctx.rank * args.per_rank_batch, (ctx.rank + 1) * args.per_rank_batch)
    return x[rows].to(ctx.device), y[rows].to(ctx.device)


def loss_of(net: nn.Module, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """The training loss of one batch (chapter 8)."""
    return nn.functional.binary_cross_entropy_with_logits(net(xs), ys)


def run_zero1(ctx: Context, args: argparse.Namespace, sizes: tuple, reduce: str) -> dict:
    """ZeRO-1 for args.steps steps; its memory, bytes, and the averaged gradients and parameters of each step (chapter 8)."""
    meter = LiveBytes(ctx.device)
    with meter:
        model = make_mlp(sizes, seed=args.seed).to(ctx.device)
        zero1 = Zero1Adam(list(model.parameters()), lr=args.lr, reduce=reduce)
    steps, grads, params = [], [], []
    for step in range(args.steps):
        xs, ys = batch(ctx, args, sizes, step)
        sent = sent_since(ctx.backend)
        steps.append(
            metered_step(meter, partial(loss_of, model, xs, ys), zero1.zero_grad, zero1.step)
        )
        steps[-1]["sent"] = sent_since(ctx.backend, sent)
        full = torch.empty_like(zero1.flat_grad)  # for the comparison only, after the step
        collective("all_gather_single")(full, zero1.shard.grad)
        grads.append(full[: zero1.numel].cpu().clone())
        params.append(zero1.flat_param[: zero1.numel].cpu().clone())
    return {"zero1": zero1, "steps": steps, "grads": grads, "params": params, "meter": meter.how}


def run_ddp(
    ctx: Context, args: argparse.Namespace, sizes: tuple, grads: list[torch.Tensor]
) -> dict:
    """DDP and full Adam, its all-reduced gradients swapped for ZeRO-1's before each step (chapter 8)."""
    meter = LiveBytes(ctx.device)
    counter = {"hook": "none", "bytes": 0}
    with meter:
        model = make_mlp(sizes, seed=args.seed).to(ctx.device)
        ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids, gradient_as_bucket_view=True)
        ddp.register_comm_hook(state=counter, hook=counting_hook)
        full = torch.optim.Adam(model.parameters(), lr=args.lr, foreach=False)
    steps, grad_diffs, params = [], [], []

    def same_gradients(step: int) -> None:
        mine = torch.cat([p.grad.cpu().reshape(-1) for p in model.parameters()])
        grad_diffs.append((mine - grads[step]).abs().max().item())  # all-reduce vs reduce-scatter
        for p, g in zip(
            model.parameters(), grads[step].split([p.numel() for p in model.parameters()])
        ):
            p.grad.copy_(g.view_as(p))  # in place: the gradients stay views of DDP's buckets

    for step in range(args.steps):
        xs, ys = batch(ctx, args, sizes, step)
        counter["bytes"] = 0
        zero_grad = lambda: full.zero_grad(set_to_none=False)  # noqa: E731 - keep the bucket views
        between = lambda s=step: same_gradients(s)  # noqa: E731
        sent = sent_since(ctx.backend)
        steps.append(
            metered_step(meter, partial(loss_of, ddp, xs, ys), zero_grad, full.step, between)
        )
        steps[-1]["sent"] = sent_since(ctx.backend, sent)
        params.append(torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()]))
    return {
        "opt": full,
        "steps": steps,
        "grad diffs": grad_diffs,
        "params": params,
        "handed": counter["bytes"],
        "meter": meter.how,
        "tensors": len(list(model.parameters())),
    }


def memory(steps: list[dict], formula: int, counters: int) -> dict:
    """The last step's bytes before, at the peak and after, next to the formula's (chapter 8)."""
    last = steps[-1]
    return {
        "before": last["before"],
        "peak": last["peak"],
        "at peak": last["at peak"],
        "after": last["after"],
        "formula": formula + counters,
        "counters": counters,
    }


def run(ctx: Context, args: argparse.Namespace) -> None:
    """ZeRO-1, the naive ZeRO-1 and DDP with full Adam; results to args.out (chapter 8)."""
    sizes = tuple(int(s) for s in args.sizes.split(","))
    z, naive = (
        run_zero1(ctx, args, sizes, "reduce_scatter"),
        run_zero1(ctx, args, sizes, "all_reduce"),
    )
    d = run_ddp(ctx, args, sizes, z["grads"])
    # on gloo, whose reduce-scatter is an all-reduce: the ring by hand, to count its bytes
    ring = run_zero1(ctx, args, sizes, "ring") if ctx.backend == "gloo" else None
    runs = {"DDP": d, "ZeRO-1": z, "ZeRO-1, naive": naive}
    runs.update({RING: ring} if ring else {})
    zero1, w = z["zero1"], ctx.world_size
    numel, ddp_counters = zero1.numel, state_bytes(d["opt"])["step counters"]
    formulas = zero_formulas(numel, w, param=4, grad=4, state=8)  # fp32 Adam: 8 bytes of moments
    handed = {
        "DDP": {"all_reduce": d["handed"]},
        "ZeRO-1": zero1.handed,
        "ZeRO-1, naive": naive["zero1"].handed,
    }
    handed.update({RING: ring["zero1"].handed} if ring else {})
    wire = {k: {op: wire_bytes(op, n, w) for op, n in ops.items()} for k, ops in handed.items()}
    as_run = {  # the ring by hand is a ring on any backend
        k: {op: wire_bytes(op, n, w, "nccl" if k == RING else ctx.backend) for op, n in ops.items()}
        for k, ops in handed.items()
    }
    sent = {k: r["steps"][-1]["sent"] for k, r in runs.items()}
    write_result(
        args.out,
        ctx,
        {
            "world_size": w,
            "parameters": numel,
            "shard": (zero1.start, zero1.stop),
            "padding": w * zero1.size - numel,
            "max param diff per step": [
                (a - b).abs().max().item() for a, b in zip(d["params"], z["params"])
            ],
            "naive max param diff per step": [
                (a - b).abs().max().item() for a, b in zip(naive["params"], z["params"])
            ],
            "ring max param diff per step": [
                (a - b).abs().max().item() for a, b in zip(ring["params"], z["params"])
            ]
            if ring
            else None,
            "max grad diff per step": d["grad diffs"],
            "losses": [s["loss"] for s in z["steps"]],
            "full Adam bytes": state_bytes(d["opt"]),
            "ZeRO-1 bytes": state_bytes(zero1.opt),
            "handed bytes per step": handed,
            "wire bytes per step": wire,
            "backend": ctx.backend,
            "wire bytes per step as the backend runs them": as_run,
            "bytes written per step": sent,
            "ring by hand written / DDP written": ring_ratio(sent),
            "formulas": formulas,
            "memory": {
                "DDP": memory(d["steps"], formulas["DDP"], ddp_counters),
                "ZeRO-1": memory(
                    z["steps"], formulas["ZeRO-1"], state_bytes(zero1.opt)["step counters"]
                ),
                "ZeRO-1, naive": memory(
                    naive["steps"],
                    formulas["ZeRO-1"],
                    state_bytes(naive["zero1"].opt)["step counters"],
                ),
            },
            "meter": z["meter"],
        },
    )
    log(ctx, bytes_line(d, z, wire, as_run, ctx.backend) + ring_line(sent))


def ring_ratio(sent: dict) -> float | None:
    """Bytes the ring by hand wrote per step over DDP's, where both were counted (chapter 8)."""
    ring, ddp = sent.get(RING), sent["DDP"]
    return None if ring is None or not ddp else ring / ddp


def ring_line(sent: dict) -> str:
    """The bytes line's end: the ring by hand's bytes written next to DDP's, where counted (chapter 8)."""
    if ring_ratio(sent) is None:
        return ""
    return tr(
        "; written to the sockets per step: ZeRO-1 with the ring by hand {ring:,} B, "
        "DDP {ddp:,} B ({ratio:.3f} times DDP's)"
    ).format(ring=sent[RING], ddp=sent["DDP"], ratio=ring_ratio(sent))


def bytes_line(d: dict, z: dict, wire: dict, as_run: dict, backend: str) -> str:
    """The last log line: bytes alive after a step and on the wire, DDP against ZeRO-1 (chapter 8)."""
    return tr(
        "bytes alive per rank after a step: DDP {ddp_after:,}, ZeRO-1 {zero_after:,}; on the "
        "wire per step, a ring (NCCL): DDP {ddp_ring:,.0f}, ZeRO-1 {zero_ring:,.0f}; as "
        "{backend} runs them: DDP {ddp_run:,.0f}, ZeRO-1 {zero_run:,.0f}"
    ).format(
        ddp_after=d["steps"][-1]["after"],
        zero_after=z["steps"][-1]["after"],
        ddp_ring=sum(wire["DDP"].values()),
        zero_ring=sum(wire["ZeRO-1"].values()),
        backend=backend,
        ddp_run=sum(as_run["DDP"].values()),
        zero_run=sum(as_run["ZeRO-1"].values()),
    )


def main(argv: list[str] | None = None) -> None:
    run_alone(build_parser(), run, argv)


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
