"""Answers to chapter 8's exercises 3 (overlap_hooks) and 4 (zero1_step) for
tests/test_ch08_checks_round4_parallel.py: the strict grader's round-31b wrong answers (each a
kind of mistake the checks used to accept or word wrongly) and right ones (refused before).

Each is self-contained: the launched ranks rebuild it from its own code and the modules it names.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn.functional as F
from torch.optim.adam import adam as functional_adam

# --- exercise 3: right answers ---------------------------------------------------------------


def hooks_through_c10d(model):
    """Right: dist.all_reduce called through the module that defines it, distributed_c10d."""
    pending = []

    def hook(p):
        pending.append((p, c10d.all_reduce(p.grad, async_op=True)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for p, work in pending:
            work.wait()
            p.grad /= c10d.get_world_size()
        pending.clear()

    return finish


def hooks_process_group_allreduce(model):
    """Right, low-level: the default process group's own allreduce([p.grad]), an async work."""
    pending = []

    def hook(p):
        pending.append((p, c10d._get_default_group().allreduce([p.grad])))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for p, work in pending:
            work.wait()
            p.grad /= dist.get_world_size()
        pending.clear()

    return finish


def hooks_wait_all_futures(model):
    """Right: the works' futures, torch.futures.wait_all in finish, then _foreach_div_."""
    futs, grads = [], []

    def hook(p):
        futs.append(dist.all_reduce(p.grad, async_op=True).get_future())
        grads.append(p.grad)

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        torch.futures.wait_all(futs)
        torch._foreach_div_(grads, dist.get_world_size())
        futs.clear()
        grads.clear()

    return finish


def hooks_keywords_and_group(model):
    """Right: every argument by keyword, the default group named."""
    pending = {}
    names = {id(p): n for n, p in model.named_parameters()}

    def hook(p):
        work = dist.all_reduce(tensor=p.grad, op=dist.ReduceOp.SUM, group=dist.group.WORLD, async_op=True)  # fmt: skip
        pending[names[id(p)]] = (p, work)

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        world = dist.get_world_size(group=dist.group.WORLD)
        for p, work in pending.values():
            work.wait()
            p.grad.div_(world)
        pending.clear()

    return finish


def hooks_chained_division_waited(model):
    """Right: the division chained with .then() (a write once the sum is complete), each
    chained future waited for in finish."""
    futs = []

    def hook(p):
        world = dist.get_world_size()
        fut = dist.all_reduce(p.grad, async_op=True).get_future()
        futs.append(fut.then(lambda f, g=p.grad: g.div_(world)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for f in futs:
            f.wait()
        futs.clear()

    return finish


def hooks_avg_op(model):
    """Right where the backend has it: ReduceOp.AVG, no division (gloo divides in its own thread)."""
    pending = []

    def hook(p):
        pending.append(dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, async_op=True))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for work in pending:
            work.wait()
        pending.clear()

    return finish


# --- exercise 3: wrong answers ---------------------------------------------------------------


def hooks_divide_by_2(model):
    """Wrong ('works on 2 ranks'): the mean hard-coded as a division by 2."""
    pending = []

    def hook(p):
        pending.append((p, dist.all_reduce(p.grad, async_op=True)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for p, work in pending:
            work.wait()
            p.grad /= 2
        pending.clear()

    return finish


def hooks_reducing_the_weights(model):
    """Wrong: all-reduces the parameter (p.detach()) in the hook, not its gradient."""
    pending = []

    def hook(p):
        pending.append((p, dist.all_reduce(p.detach(), async_op=True)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for p, work in pending:
            work.wait()
            with torch.no_grad():
                p /= dist.get_world_size()
        pending.clear()

    return finish


def hooks_value_without_wait(model):
    """Wrong (race): the division chained with .then(), finish() reads each chained future's
    value() without waiting: value() is for a future already complete."""
    futs = []

    def hook(p):
        world = dist.get_world_size()
        fut = dist.all_reduce(p.grad, async_op=True).get_future()
        futs.append(fut.then(lambda f, g=p.grad: g.div_(world)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for f in futs:
            f.value()
        futs.clear()

    return finish


def hooks_blocking_all_reduce_in_threads(model):
    """Wrong (the collectives' order is a race): each hook starts a thread running a blocking
    dist.all_reduce(p.grad); finish() joins them."""
    threads = []

    def hook(p):
        th = threading.Thread(target=dist.all_reduce, args=(p.grad,))
        th.start()
        threads.append((p, th))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for p, th in threads:
            th.join()
            p.grad /= dist.get_world_size()
        threads.clear()

    return finish


def hooks_dividing_in_flight(model):
    """Wrong (race): the hook divides p.grad right after starting its async all-reduce, while the
    sum is still travelling; finish() only waits."""
    pending = []

    def hook(p):
        pending.append(dist.all_reduce(p.grad, async_op=True))
        p.grad /= dist.get_world_size()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for work in pending:
            work.wait()
        pending.clear()

    return finish


# --- exercise 4: shared steps ----------------------------------------------------------------
# Every answer below is written out in full (the ranks rebuild each from its own code).


def zero1_through_c10d(params, shard, optimizer):
    """Right: the recommended collectives called through distributed_c10d."""
    world, rank, s = c10d.get_world_size(), c10d.get_rank(), shard.numel()
    rs = getattr(c10d, "reduce_scatter_single", None) or c10d.reduce_scatter_tensor
    ag = getattr(c10d, "all_gather_single", None) or c10d.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad)
    shard.grad = piece.div_(world)
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_keyword_arguments(params, shard, optimizer):
    """Right: the recommended collectives with their arguments named as their signatures name them."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    if hasattr(dist, "reduce_scatter_single"):
        dist.reduce_scatter_single(output=piece, input=flat_grad)
    else:
        dist.reduce_scatter_tensor(output=piece, input=flat_grad)
    shard.grad = piece.div_(world)
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    if hasattr(dist, "all_gather_single"):
        dist.all_gather_single(output_tensor=flat, input_tensor=mine)
    else:
        dist.all_gather_into_tensor(output_tensor=flat, input_tensor=mine)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_list_forms(params, shard, optimizer):
    """Right: dist.reduce_scatter(piece, chunks) and dist.all_gather(views of one buffer, shard)."""
    world, s = dist.get_world_size(), shard.numel()
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    dist.reduce_scatter(piece, list(flat_grad.chunk(world)))
    shard.grad = piece / world
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    dist.all_gather(list(flat.chunk(world)), shard.detach())
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_persistent_buffers(params, shard, optimizer):
    """Right: flat buffers kept on the optimizer between steps (the collectives' own, not state),
    moved with torch._foreach_copy_ through views."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    bufs = getattr(optimizer, "zero1_bufs", None)
    if bufs is None or bufs[0].dtype != shard.dtype:
        optimizer.zero1_bufs = (
            torch.zeros(world * s, dtype=shard.dtype),
            torch.empty(world * s, dtype=shard.dtype),
            torch.empty_like(shard),
        )
    gbuf, pbuf, piece = optimizer.zero1_bufs
    sizes = [p.numel() for p in params]
    views = [v.view_as(p) for v, p in zip(gbuf[: sum(sizes)].split(sizes), params)]
    torch._foreach_copy_(views, [p.grad for p in params])
    rs(piece, gbuf)
    shard.grad = piece / world
    optimizer.step()
    pbuf[rank * s : (rank + 1) * s].copy_(shard.detach())
    ag(pbuf, pbuf[rank * s : (rank + 1) * s])
    with torch.no_grad():
        torch._foreach_copy_(params, [v.view_as(p) for v, p in zip(pbuf[: sum(sizes)].split(sizes), params)])  # fmt: skip


def zero1_avg_op(params, shard, optimizer):
    """Right where the backend has it: ReduceOp.AVG in the reduce-scatter, no division."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad, op=dist.ReduceOp.AVG)
    shard.grad = piece
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_async_waited(params, shard, optimizer):
    """Right: both collectives async, each waited for before its result is used."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad, async_op=True).wait()
    shard.grad = piece.div_(world)
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    work = ag(flat, mine, async_op=True)
    work.wait()
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


# --- exercise 4: wrong answers ---------------------------------------------------------------


def zero1_grad_buffer_float32(params, shard, optimizer):
    """Wrong (dtype): the flat gradient buffer made with torch.zeros(world * s), float32 in the
    float64 run: every gradient passes through float32."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    flat_grad = torch.zeros(world * s)
    offset = 0
    for p in params:
        flat_grad[offset : offset + p.numel()] = p.grad.reshape(-1)
        offset += p.numel()
    piece = torch.empty(s)
    rs(piece, flat_grad)
    shard.grad = (piece / world).to(shard.dtype)
    optimizer.step()
    flat = torch.empty(world * s, dtype=shard.dtype)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_state_cleared(params, shard, optimizer):
    """Wrong: clears the optimizer's state before each step ('to save memory')."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad)
    shard.grad = piece.div_(world)
    optimizer.state.clear()
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_new_adam_each_step(params, shard, optimizer):
    """Wrong (ignores the optimizer given): a new Adam over the shard in each call."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad)
    shard.grad = piece.div_(world)
    torch.optim.Adam([shard], lr=0.01, foreach=False).step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_step_twice(params, shard, optimizer):
    """Wrong: optimizer.step() after the reduce-scatter and once more after the gather."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad)
    shard.grad = piece.div_(world)
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine)
    optimizer.step()
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_async_never_waited(params, shard, optimizer):
    """Wrong (race): both collectives async_op=True, never waited for."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad, async_op=True)
    shard.grad = piece.div_(world)
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine, async_op=True)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_gather_async_not_waited(params, shard, optimizer):
    """Wrong (race): only the all-gather async ('overlap it'), never waited for."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad)
    shard.grad = piece.div_(world)
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine, async_op=True)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_gather_waited_after_copy(params, shard, optimizer):
    """Wrong (race): the all-gather async, the parameters copied from its buffer, then the wait."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad)
    shard.grad = piece.div_(world)
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    work = ag(flat, mine, async_op=True)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
    work.wait()  # too late: the parameters were copied from a buffer still filling


def zero1_grad_view_keeps_full(params, shard, optimizer):
    """Wrong (memory): shard.grad is a view of a world x s buffer, which it keeps alive."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    out = torch.empty_like(flat_grad)
    rs(out[rank * s : (rank + 1) * s], flat_grad)
    shard.grad = out[rank * s : (rank + 1) * s].div_(world)
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_functional_full_adam(params, shard, optimizer):
    """Cheat: the averaged pieces all-gathered, a full Adam state kept on the optimizer object and
    stepped with torch.optim.adam.adam (no optimizer.step hook); the shard stepped too."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad)
    shard.grad = piece.div_(world)
    full_grad = torch.empty_like(flat_grad)
    ag(full_grad, shard.grad.detach().clone())
    if not hasattr(optimizer, "full_state"):  # full Adam over the parameters, kept on the optimizer
        optimizer.full_state = {
            "m": [torch.zeros_like(p) for p in params],
            "v": [torch.zeros_like(p) for p in params],
            "step": [torch.tensor(0.0) for _ in params],
        }
    st, grads, offset = optimizer.full_state, [], 0
    for p in params:
        grads.append(full_grad[offset : offset + p.numel()].view_as(p).clone())
        offset += p.numel()
    group = optimizer.param_groups[0]
    with torch.no_grad():
        functional_adam(
            [p.detach() for p in params], grads, st["m"], st["v"], [], st["step"],
            foreach=False, amsgrad=False, beta1=group["betas"][0], beta2=group["betas"][1],
            lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
        )  # fmt: skip
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    flat[rank * s : (rank + 1) * s].copy_(shard.detach())
    ag(flat, flat[rank * s : (rank + 1) * s])


def zero1_functional_full_adam_no_extra_traffic(params, shard, optimizer):
    """Cheat without extra traffic (right values at one rank, where a rank's own gradient is the
    mean): ZeRO-1's collectives, then full Adam state kept on the optimizer object and stepped
    with torch.optim.adam.adam over the whole parameters."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad)
    shard.grad = piece.div_(world)
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    flat[rank * s : (rank + 1) * s].copy_(shard.detach())
    ag(flat, flat[rank * s : (rank + 1) * s])
    full_grad = flat_grad / world
    if not hasattr(optimizer, "full_state"):  # full Adam over the parameters, kept on the optimizer
        optimizer.full_state = {
            "m": [torch.zeros_like(p) for p in params],
            "v": [torch.zeros_like(p) for p in params],
            "step": [torch.tensor(0.0) for _ in params],
        }
    st, grads, offset = optimizer.full_state, [], 0
    for p in params:
        grads.append(full_grad[offset : offset + p.numel()].view_as(p).clone())
        offset += p.numel()
    group = optimizer.param_groups[0]
    with torch.no_grad():
        functional_adam(
            [p.detach() for p in params], grads, st["m"], st["v"], [], st["step"],
            foreach=False, amsgrad=False, beta1=group["betas"][0], beta2=group["betas"][1],
            lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
        )  # fmt: skip


def zero1_divide_by_2(params, shard, optimizer):
    """Wrong ('works on 2 ranks'): the mean hard-coded as piece / 2."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad)
    shard.grad = piece / 2
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_all_reduce_by_rs_and_ag(params, shard, optimizer):
    """Wrong (the naive all-reduce in two parts): reduce-scatter, all-gather the averaged pieces
    (the whole mean on every rank), keep this rank's slice: 3 ring shares on the wire."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad)
    mean = torch.empty_like(flat_grad)
    ag(mean, piece / world)
    shard.grad = mean[rank * s : (rank + 1) * s].clone()
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_piece_read_before_wait(params, shard, optimizer):
    """Wrong (race): the reduce-scatter async, its piece divided into shard.grad (a read), and
    only then the wait."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    work = rs(piece, flat_grad, async_op=True)
    shard.grad = piece / world  # read while the sum may still be arriving
    work.wait()
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_step_before_wait(params, shard, optimizer):
    """Wrong (race): the averaging reduce-scatter async straight into shard.grad, stepped before
    its wait."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    shard.grad = torch.empty_like(shard)
    work = rs(shard.grad, flat_grad, op=dist.ReduceOp.AVG, async_op=True)
    optimizer.step()  # reads shard.grad while the sum may still be arriving
    work.wait()
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
