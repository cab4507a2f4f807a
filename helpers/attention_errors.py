"""Judging an attention kernel by a rule adapted from FlashAttention's own tests: its error
against a float64 reference (theirs: float32, upcast), at most a small factor times the error
plain PyTorch makes in the same dtype (theirs: 2 on the output, 3 on the gradients); and a
gallery of planted bugs, each one changed line of the chapter's tiles, that the rule must catch
(chapter 8)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from helpers.attention_tiles import BOUNDED, rounding_bound
from helpers.flash_attention import flash_backward, flash_forward
from helpers.i18n import tr, tr_mark

#: The results a kernel is judged on, in this order.
JUDGED = ("out", "lse", "dq", "dk", "dv")
#: How many times plain PyTorch's error (in the kernel's dtype) a kernel may make, by dtype.
#: 16-bit: FlashAttention's tests' factor on the output (the course uses it on the gradients
#: too); each result's final rounding to 16 bits dominates both errors. float32: the errors are
#: accumulated roundings, and the largest of many varies between two orders of the same sums:
#: calibrated on one rerun (2026-11-27, torch 2.13 CPU, 60 seeds x 5 shapes: correct tiles
#: 5.75x, SDPA 7.6x), re-checked on 8 seeds x 4 shapes by tests/test_attention_errors.py.
ALLOWED_FACTOR = {torch.float16: 2.0, torch.bfloat16: 2.0, torch.float32: 10.0}


Forward = Callable[..., tuple[torch.Tensor, torch.Tensor]]
Backward = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


class KernelPair(torch.autograd.Function):
    """A forward (out, lse) and a backward (dq, dk, dv) as one differentiable attention (chapter 8)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, forward, backward):  # noqa: ANN001, ANN205
        out, lse = forward(q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.backward = causal, backward
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):  # noqa: ANN001, ANN205
        q, k, v, out, lse = ctx.saved_tensors
        grads = ctx.backward(q, k, v, out, lse, dout.contiguous(), ctx.causal)
        return *(g.to(x.dtype) for g, x in zip(grads, (q, k, v))), None, None, None


def plain_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention written out in q's own dtype: the output and each row's log-sum-exp (chapter 8)."""
    t = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    if causal:
        future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v, torch.logsumexp(scores, dim=-1)


def kernel_results(
    attention: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    causal: bool,
) -> dict[str, torch.Tensor]:
    """out, lse and the gradients of q, k, v for the upstream gradient dout, of attention(q, k, v, causal) (chapter 8)."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out, lse = attention(*leaves, causal)
    out.backward(dout)
    return dict(zip(JUDGED, (out.detach(), lse.detach(), *(x.grad for x in leaves))))


def tiles_pair(forward: Forward = flash_forward, backward: Backward = flash_backward) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """attention(q, k, v, causal) -> (out, lse) from a forward and a backward, default the chapter's tiles (chapter 8)."""
    return lambda q, k, v, causal: KernelPair.apply(q, k, v, causal, forward, backward)


def _max_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    """The largest |got - exact|, in float64, with -inf = -inf counted as no error (chapter 8)."""
    got, exact = got.detach().cpu().double(), exact.detach().cpu().double()
    diff = torch.where(got == exact, torch.zeros_like(got), (got - exact).abs())
    return diff.max().item() if diff.numel() else 0.0


def allowed_factor(dtype: torch.dtype) -> float:
    """ALLOWED_FACTOR for a kernel's input dtype: float16, bfloat16 or float32 (chapter 8)."""
    if dtype not in ALLOWED_FACTOR:
        raise ValueError(tr("The rule judges float16, bfloat16 and float32 kernels against float64, not {dtype}.").format(dtype=dtype))  # fmt: skip
    return ALLOWED_FACTOR[dtype]


def error_ratios(
    got: dict[str, torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    causal: bool,
) -> dict[str, dict[str, float]]:
    """Per result: the kernel's largest error against float64, plain PyTorch's in q's dtype, their ratio (chapter 8).

    PyTorch's error is taken at least as large as rounding the largest exact value to q's
    dtype (half its eps, relative): no computation in that dtype can promise less, and a lucky
    small error of the plain computation would otherwise make the yardstick arbitrarily strict.
    """
    exact = kernel_results(plain_attention, *(x.double() for x in (q, k, v, dout)), causal)
    same_dtype = kernel_results(plain_attention, q, k, v, dout, causal)
    return {name: _judge(got[name], same_dtype[name], exact[name], q.dtype) for name in JUDGED}


def _judge(got: torch.Tensor, same_dtype: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> dict[str, float]:  # fmt: skip
    """One result's largest error, PyTorch's (at least one rounding of the largest exact value) and their ratio (chapter 8)."""
    finite = exact[torch.isfinite(exact)]
    storing = torch.finfo(dtype).eps / 2 * (finite.abs().max().item() if finite.numel() else 0.0)
    mine = _max_error(got, exact)
    torch_error = max(_max_error(same_dtype, exact), storing)
    ratio = mine / torch_error if torch_error > 0 else (0.0 if mine == 0 else math.inf)
    return {"error": mine, "pytorch error": torch_error, "ratio": ratio}


def output_ratio(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> dict[str, float]:  # fmt: skip
    """error_ratios for a forward's output alone, as the timing sweep checks each method (chapter 8)."""
    with torch.no_grad():
        exact = plain_attention(*(x.double() for x in (q, k, v)), causal)[0]
        same_dtype = plain_attention(q, k, v, causal)[0]
    return _judge(out, same_dtype, exact, q.dtype)


def lse_ratio(
    lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor, causal: bool
) -> dict[str, float]:
    """A forward's log-sum-exp judged as error_ratios does, against logsumexp computed in lse's own dtype (chapter 8).

    A tile loop returns the lse in the dtype it accumulates in (float32 for 16-bit inputs), so
    the yardstick is PyTorch's logsumexp of the same inputs in that dtype, not in q's.
    """
    with torch.no_grad():
        exact = plain_attention(*(x.double() for x in (q, k, k)), causal)[1]
        same_dtype = plain_attention(*(x.to(lse.dtype) for x in (q, k, k)), causal)[1]
    return _judge(lse, same_dtype, exact, lse.dtype)


def worst(ratios: dict[str, dict[str, float]]) -> tuple[str, float]:
    """The result with the largest ratio, and that ratio (chapter 8)."""
    name = max(ratios, key=lambda n: ratios[n]["ratio"])
    return name, ratios[name]["ratio"]


def plant(fn: Callable[..., Any], old: str, new: str) -> Callable[..., Any]:
    """fn rebuilt from its source with the one line holding `old` changed to `new` (chapter 8)."""
    source = inspect.getsource(fn)
    if source.count(old) != 1:
        raise ValueError(
            tr("{old!r} is not exactly once in {name}: the gallery is stale.").format(
                old=old, name=fn.__name__
            )
        )
    namespace = dict(fn.__globals__)
    exec(compile(source.replace(old, new), f"<{fn.__name__}, planted>", "exec"), namespace)  # noqa: S102
    return namespace[fn.__name__]


@dataclass(frozen=True)
class PlantedBug:
    """One line of flash_forward or flash_backward changed, and the dtype it is tried in (chapter 8)."""

    name: str
    function: str  # "forward" or "backward"
    old: str
    new: str
    dtype: torch.dtype

    def attention(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        """The tiles with this bug planted, as attention(q, k, v, causal) -> (out, lse) (chapter 8)."""
        if self.function == "forward":
            return tiles_pair(forward=plant(flash_forward, self.old, self.new))
        return tiles_pair(backward=plant(flash_backward, self.old, self.new))


#: The gallery: mistakes a real kernel makes, each small next to the outputs themselves.
PLANTED_BUGS = (
    PlantedBug(
        tr_mark("P rounded to fp16 before P @ V"),
        "forward",
        "+ p @ vj",
        "+ p.half().to(p.dtype) @ vj",
        torch.float32,
    ),  # fmt: skip
    PlantedBug(
        tr_mark("D from an fp16-rounded O"),
        "backward",
        "(dout * out).sum(-1)",
        "(dout * out.half().to(out.dtype)).sum(-1)",
        torch.float32,
    ),  # fmt: skip
    PlantedBug(
        tr_mark("log-sum-exp off by 1e-4"),
        "forward",
        "m + torch.log(ell)",
        "m + torch.log(ell) + 1e-4",
        torch.float32,
    ),  # fmt: skip
    PlantedBug(
        tr_mark("scores scaled 10% too much"),
        "forward",
        "to(acc_dtype) * scale",
        "to(acc_dtype) * scale * 1.1",
        torch.bfloat16,
    ),  # fmt: skip
    PlantedBug(
        tr_mark("mask one late in query tile 2"),
        "forward",
        "keys > rows,",
        "keys > rows + (qs == block_q),",
        torch.bfloat16,
    ),  # fmt: skip
    PlantedBug(
        tr_mark("no rescale of acc in the merge"),
        "forward",
        "acc = acc * rescale[..., None] +",
        "acc = acc +",
        torch.float32,
    ),  # fmt: skip
)


#: The gallery's columns: each bug's largest |error| / (2 x rounding_bound), where at most 1 is
#: what the worst-case rule would pass (two computations differ by at most twice the bound).
OUT_SHARE, GRADS_SHARE = tr_mark("out: err / (2 x bound)"), tr_mark("grads: err / (2 x bound)")
#: The gallery's other column names (keys the notebook reads; a printed table translates them).
_COLUMNS = (
    tr_mark("planted bug"),
    tr_mark("worst"),
    tr_mark("x PyTorch's error"),
    tr_mark("caught"),
)


def judge_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0, device: str | torch.device = "cpu"
) -> list[torch.Tensor]:
    """q, k, v and an upstream gradient, standard normal, seeded, in dtype on device (chapter 8)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(device, dtype) for _ in range(4)]


def _worst_case_shares(got: dict[str, torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, causal: bool) -> tuple[float, float]:  # fmt: skip
    """The largest |got - float64| / (2 x rounding_bound) of the output, and of the gradients (chapter 8)."""
    exact = kernel_results(plain_attention, *(x.double() for x in (q, k, v, dout)), causal)
    low = q.dtype if q.dtype.itemsize < 4 else None
    bound = rounding_bound(q, k, v, dout, causal, rounded_to=low)
    frac = {n: ((got[n].cpu().double() - exact[n]).abs() / (2 * bound[n])).max().item() for n in BOUNDED}  # fmt: skip
    return frac["out"], max(frac["dq"], frac["dk"], frac["dv"])


def bug_gallery(shape: tuple[int, ...] = (1, 2, 200, 32), causal: bool = True, seed: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """Each planted bug judged by error_ratios, and its largest error / (2 x rounding_bound) (chapter 8)."""
    rows = []
    for bug in PLANTED_BUGS:
        q, k, v, dout = judge_inputs(shape, bug.dtype, seed)
        got = kernel_results(bug.attention(), q, k, v, dout, causal)
        name, ratio = worst(error_ratios(got, q, k, v, dout, causal))
        out, grads = _worst_case_shares(got, q, k, v, dout, causal)
        rows.append({"planted bug": tr(bug.name), "dtype": str(bug.dtype).removeprefix("torch."), "worst": name, "x PyTorch's error": ratio, "caught": ratio > allowed_factor(bug.dtype), OUT_SHARE: out, GRADS_SHARE: grads})  # fmt: skip
    return rows
