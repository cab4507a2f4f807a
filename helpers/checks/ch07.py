"""Checkers for the chapter 7 exercises (the capstone: a small GPT trained fast) (chapter 7).

Each ``check_*`` takes the learner's function, runs probes that a plausible wrong answer
fails (shapes, dtypes, devices, side effects and the order of the work, not only the value
returned) and prints ✅, ❌ with a hint, or ⏳ for an untouched stub. None of them raises.
Every probe runs on the CPU or on the meta device (shapes only), in a few seconds.
"""

from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import cache
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from helpers.activations import ActivationMeter
from helpers.checks import (
    CheckFailed,
    CheckResult,
    expect,
    forwards_at_once,
    names_used,
    one_backward_per_forward_hint,
    probe,
    run_check,
    work_order,
)
from helpers.gpt import (
    GPT,
    GPTConfig,
    flops_per_token,
    make_gpt,
    manual_attention,
    non_embedding_params,
)
from helpers.i18n import tr, tr_mark
from helpers.max_batch import find_max_batch
from helpers.syncs import SyncCounter

# --- exercise 1: causal attention --------------------------------------------------------------

_WRITE_IT_OUT = tr_mark(
    "you called {what}, which does the whole exercise for you. Write it out: "
    "scores = q @ k.transpose(-2, -1) / sqrt(head_dim), the future masked with -inf, "
    "softmax over the keys, then @ v."
)


_KEEP_DTYPE = tr_mark(
    "Keep q's dtype: hide scores with masked_fill and a boolean mask (or build the mask in "
    "q.dtype), not by adding a float32 tensor."
)


#: Pieces of the names of the aten ops behind every fused attention entry point: F.sdpa, its
#: CPU flash, memory-efficient, cuDNN and math kernels, the kernel choice, nn.MultiheadAttention's
#: fast path and the fused transformer layers.
_FUSED_ATTENTION_OPS = (
    "scaled_dot_product",
    "_fused_sdp_choice",
    "flash_attention",
    "efficient_attention",
    "cudnn_attention",
    "native_multi_head_attention",
    "_transformer_encoder_layer_fwd",
)


class _NoBuiltinAttention(TorchFunctionMode):
    """Fail the check when the code inside calls F.scaled_dot_product_attention or an attention op by name (chapter 7).

    Some aten attention ops (the math kernel, ``aten._scaled_dot_product_attention_math``) are
    composites: they run as plain matmuls and a softmax, so only their name, seen here before
    they decompose, gives them away.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = str(getattr(func, "__name__", ""))
        if name == "scaled_dot_product_attention":
            raise CheckFailed(tr(_WRITE_IT_OUT).format(what="F.scaled_dot_product_attention"))
        if any(piece in name for piece in _FUSED_ATTENTION_OPS):
            what = (
                tr("PyTorch's own attention operator (aten {name})")
                if "math" in name
                else tr("a fused attention kernel (aten {name})")
            ).format(name=name)
            raise CheckFailed(tr(_WRITE_IT_OUT).format(what=what))
        return func(*args, **(kwargs or {}))


class _NoFusedAttention(TorchDispatchMode):
    """Fail the check when any aten op of a fused attention kernel runs inside (chapter 7).

    Below every Python entry point (``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu``,
    ``torch._C._nn.scaled_dot_product_attention``, ``nn.MultiheadAttention``, ...) the same few
    aten ops run, so the ban holds whatever name the code used to reach them.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = str(getattr(func, "__name__", func))
        if any(piece in name for piece in _FUSED_ATTENTION_OPS):
            what = tr("a fused attention kernel (aten {name})").format(name=name)
            raise CheckFailed(tr(_WRITE_IT_OUT).format(what=what))
        return func(*args, **(kwargs or {}))


@contextmanager
def _no_builtin_attention() -> Iterator[None]:
    """Both bans: F.scaled_dot_product_attention by name, and every fused kernel below it (chapter 7)."""
    with _NoBuiltinAttention(), _NoFusedAttention():
        yield


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    hide: str = "future",
    fill: float = float("-inf"),
    dim: int = -1,
) -> torch.Tensor:
    """Attention in float64 hiding 'future', 'past', 'future+self', 'past+self' or 'nothing' (chapter 7)."""
    q, k, v = (t.detach().double().cpu() for t in (q, k, v))
    i = torch.arange(q.size(-2)).unsqueeze(1)  # query position, a column
    j = torch.arange(q.size(-2)).unsqueeze(0)  # key position, a row
    hidden = {
        "future": j > i,
        "past": j < i,
        "future+self": j >= i,
        "past+self": j <= i,
        "nothing": j < 0,
    }[hide]
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(hidden, fill)
    return torch.softmax(scores, dim=dim) @ v


def _attention_mistakes(q: torch.Tensor) -> list[tuple[dict[str, Any], str]]:
    """(how a typical wrong attention differs, the hint that names the mistake) (chapter 7)."""
    heads, t, d = q.size(1), q.size(2), q.size(3)
    right = 1 / math.sqrt(d)
    return [
        (
            {"scale": right, "hide": "nothing"},
            tr(
                "it is not causal: position i also attends to later positions. Hide the future: "
                "set the scores where key j > query i to -inf before the softmax."
            ),
        ),
        (
            {"scale": right, "hide": "past"},
            tr(
                "the mask is on the wrong side: you hid the past (keys j < i) and kept the future. "
                "Position i may see keys 0..i: hide j > i, e.g. torch.ones(t, t, dtype=torch.bool, "
                "device=q.device).triu(1)."
            ),
        ),
        (
            {"scale": right, "hide": "past+self"},
            tr(
                "the mask is on the wrong side: you hid keys 0..i, which position i may see, and "
                "kept the future. masked_fill hides where the mask is True: hide j > i with "
                ".triu(1), or fill where ~torch.tril(...) is True."
            ),
        ),
        (
            {"scale": right, "hide": "future+self"},
            tr(
                "you hid the diagonal too: position i must see itself (the first position sees "
                "nothing else, so its softmax is all -inf, NaN). Hide j > i only: .triu(1), not "
                ".triu()."
            ),
        ),
        (
            {"scale": right, "fill": 0.0},
            tr(
                "the hidden scores are 0, and exp(0) = 1 still gives them weight. Fill them with "
                "float('-inf') (masked_fill), so the softmax gives them exactly 0."
            ),
        ),
        ({"scale": right, "dim": -2}, tr("take the softmax over the keys (dim=-1), not dim=-2.")),
        ({"scale": 1.0}, tr("the scores are not scaled: divide q @ k^T by sqrt(head_dim).")),
        (
            {"scale": 1 / t},
            tr("you scaled by the sequence length; divide by sqrt(head_dim) = sqrt(q.size(-1))."),
        ),
        (
            {"scale": 1 / math.sqrt(t)},
            tr(
                "you divided by sqrt(sequence length); divide by sqrt(head_dim) = sqrt(q.size(-1))."
            ),
        ),
        ({"scale": 1 / d}, tr("you divided by head_dim; divide by its square root.")),
        (
            {"scale": 1 / math.sqrt(heads * d)},
            tr(
                "you divided by sqrt(d_model) = sqrt(heads * head_dim); each head's scores are "
                "scaled by its own width, sqrt(q.size(-1))."
            ),
        ),
    ]


def _attention_hint(got: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """Name the mistake whose output matches `got`, or say how far it is from SDPA (chapter 7)."""
    out = got.detach().double().cpu()
    for how, hint in _attention_mistakes(q):
        if torch.allclose(out, _attention(q, k, v, **how), rtol=1e-3, atol=1e-4, equal_nan=True):
            return hint
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    gap = (out - want.cpu()).abs().max().item()
    return tr(
        "your output differs from F.scaled_dot_product_attention(q, k, v, is_causal=True) "
        "by up to {gap:.3g}: softmax(q @ k^T / sqrt(head_dim), future hidden) @ v."
    ).format(gap=gap)


#: (name, shape (batch, heads, seq, head_dim), dtype, non-contiguous?): the first tells
#: every typical mistake apart; then one position, odd lengths, other widths and dtypes.
_ATTENTION_PROBES = (
    ("fp32", (2, 4, 6, 16), torch.float32, False),
    (tr_mark("one position"), (1, 1, 1, 8), torch.float32, False),
    (tr_mark("odd seq length"), (3, 2, 7, 4), torch.float32, False),
    ("fp64", (1, 3, 13, 32), torch.float64, False),
    ("bf16", (2, 2, 9, 8), torch.bfloat16, False),
    (tr_mark("transposed views, as the model makes them"), (2, 3, 11, 6), torch.float32, True),
)


def _qkv(shape: tuple[int, ...], dtype: torch.dtype, strided: bool, seed: int) -> list:
    """Three random tensors of `shape`; views of a (batch, seq, heads, dim) tensor if `strided` (chapter 7)."""
    g = torch.Generator().manual_seed(seed)
    b, h, t, d = shape
    if strided:
        return [torch.randn(b, t, h, d, generator=g).to(dtype).transpose(1, 2) for _ in "qkv"]
    return [torch.randn(shape, generator=g).to(dtype) for _ in "qkv"]


def _run_attention(fn: Callable[..., torch.Tensor], name: str, qkv: list) -> torch.Tensor:
    """Call fn(q, k, v) with SDPA forbidden; check type, shape, dtype, device, inputs (chapter 7)."""
    q = qkv[0]
    before = [(t.clone(), t._version) for t in qkv]
    try:
        with probe(name), _no_builtin_attention():
            got = fn(*qkv)
    except CheckFailed as exc:
        if q.dtype == torch.float32 or "dtype" not in str(exc):
            raise
        raise CheckFailed(f"{exc} {tr(_KEEP_DTYPE)}") from None
    where = tr("[probe: {name}, q of shape {shape} {dtype}] ").format(
        name=name, shape=tuple(q.shape), dtype=q.dtype
    )
    expect(
        isinstance(got, torch.Tensor),
        where + tr("return a tensor, not {type}.").format(type=type(got).__name__),
    )
    expect(
        all(t._version == n and (t.is_meta or torch.equal(t, c)) for t, (c, n) in zip(qkv, before)),
        where
        + tr(
            "you changed q, k or v in place (q /= ..., mul_, masked_fill_ on an input): "
            "the caller's tensors must come back as they were. Use out-of-place operations."
        ),
    )
    expect(
        tuple(got.shape) == tuple(q.shape),
        where
        + tr(
            "the output has shape {shape}; it must be q's shape, (batch, heads, seq, head_dim)."
        ).format(shape=tuple(got.shape)),
    )
    expect(
        got.dtype == q.dtype,
        where
        + tr("the output is {got} for {want} inputs. {advice}").format(
            got=got.dtype, want=q.dtype, advice=tr(_KEEP_DTYPE)
        ),
    )
    expect(
        got.device == q.device,
        where + tr("the output is on {got}, q on {want}.").format(got=got.device, want=q.device),
    )
    return got


def _value_probes(fn: Callable[..., torch.Tensor]) -> None:
    """Outputs equal to SDPA's over shapes, dtypes and strides (chapter 7)."""
    for n, (name, shape, dtype, strided) in enumerate(_ATTENTION_PROBES):
        qkv = _qkv(shape, dtype, strided, seed=n)
        name = tr(name)
        got = _run_attention(fn, name, qkv)
        if n == 0:
            for helper in ("manual_attention", "scaled_dot_product_attention"):
                expect(helper not in names_used(fn), tr(_WRITE_IT_OUT).format(what=helper))
        wide = [t.float() if dtype == torch.bfloat16 else t for t in qkv]
        want = F.scaled_dot_product_attention(*wide, is_causal=True)
        tol = {torch.bfloat16: 3e-2, torch.float32: 1e-5, torch.float64: 1e-10}[dtype]
        if not torch.allclose(got.to(want.dtype), want, rtol=tol, atol=tol):
            raise CheckFailed(
                tr("[probe: {name}] {text}").format(name=name, text=_attention_hint(got, *qkv))
            )


def _large_scores_probe(fn: Callable[..., torch.Tensor]) -> None:
    """Scores in the thousands, where exp() overflows fp32: the max must come off first (chapter 7)."""
    q, k, v = _qkv((2, 2, 8, 16), torch.float32, False, seed=20)
    q, k = q * 40, k * 40  # scores q.k / 4 of order 40 * 40: far above log(fp32 max) = 88.7
    name = tr("large scores (q and k times 40)")
    got = _run_attention(fn, name, [q, k, v])
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    largest = (q.double() @ k.double().transpose(-2, -1)).abs().max().item() / 4
    if not torch.isfinite(got).all():
        raise CheckFailed(
            tr(
                "[probe: {name}] your output has inf or NaN: with scores up to {largest:.0f}, "
                "exp(score) overflows float32 (above 88.7) and inf / inf is NaN. Subtract each "
                "row's max before exp (torch.softmax does it for you): the result is the same."
            ).format(name=name, largest=largest)
        )
    # Rounding q @ k^T in fp32 moves each score by up to ~eps * |score| * 2, and a weight
    # exp(score - max) by as much relatively; 8x that bound covers summation order.
    tol = 8 * 2 * torch.finfo(torch.float32).eps * largest
    if not torch.allclose(got.double(), want, rtol=tol, atol=tol):
        raise CheckFailed(
            tr("[probe: {name}] {text}").format(name=name, text=_attention_hint(got, q, k, v))
        )


def _meta_probe(fn: Callable[..., torch.Tensor]) -> None:
    """On the meta device: right shape and device, and no CPU tensor (mask) mixed in (chapter 7)."""
    qkv = [torch.empty(2, 4, 6, 16, device="meta") for _ in "qkv"]
    try:
        _run_attention(fn, tr("meta device"), qkv)
    except CheckFailed as exc:
        if not any(w in str(exc) for w in ("expected device", "same device")):
            raise
        raise CheckFailed(
            tr(
                "[probe: q, k, v on the meta device] a tensor you made is on the CPU while q is "
                "not: on a GPU this fails. Create the mask on q's device: torch.ones(t, t, "
                "dtype=torch.bool, device=q.device)."
            )
        ) from None


def _causal_and_gradient_probes(fn: Callable[..., torch.Tensor]) -> None:
    """Later keys/values leave earlier outputs alone; gradients equal SDPA's (chapter 7)."""
    q, k, v = _qkv((1, 2, 8, 4), torch.float64, False, seed=10)
    with probe(tr("changing keys and values after position 3")):
        first = fn(q, k, v)
        k2, v2 = k.clone(), v.clone()
        k2[:, :, 4:] += 1.0
        v2[:, :, 4:] -= 2.0
        second = fn(q, k2, v2)
    expect(
        torch.allclose(first[:, :, :4], second[:, :, :4], rtol=0, atol=1e-12),
        tr(
            "[probe: changing keys and values after position 3] the outputs of positions 0..3 "
            "changed: they must not depend on later positions. Hide the scores where key j > "
            "query i."
        ),
    )
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    weights = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(3))
    with probe(tr("gradients")), _no_builtin_attention():
        out = fn(*leaves)
        expect(
            out.requires_grad,
            tr(
                "the output does not require grad for inputs that do: keep the computation in "
                "autograd (no torch.no_grad(), .detach() or .data)."
            ),
        )
        (out * weights).sum().backward()
    mine = [t.clone().requires_grad_() for t in (q, k, v)]
    (F.scaled_dot_product_attention(*mine, is_causal=True) * weights).sum().backward()
    expect(
        all(a.grad is not None for a in leaves),
        tr("[probe: gradients] q, k or v got no gradient: keep the computation in autograd."),
    )
    expect(
        all(torch.allclose(a.grad, b.grad, atol=1e-10) for a, b in zip(leaves, mine)),
        tr(
            "[probe: gradients] the gradients of q, k and v differ from those of "
            "F.scaled_dot_product_attention."
        ),
    )


@cache
def _meta_attention_runs() -> bool:
    """Whether attention written out (the model's own) runs on the meta device with this torch (chapter 7)."""
    try:
        q = torch.empty(1, 1, 2, 2, device="meta")
        return manual_attention(q, q, q).is_meta
    except (RuntimeError, NotImplementedError):
        return False


def check_causal_attention(fn: Callable[..., torch.Tensor]) -> CheckResult:
    """Exercise 1: causal attention equal to SDPA's over shapes, dtypes and devices, written out (chapter 7)."""

    def probes() -> None:
        _value_probes(fn)
        _large_scores_probe(fn)
        _causal_and_gradient_probes(fn)
        if _meta_attention_runs():
            _meta_probe(fn)

    return run_check(tr("Exercise 1, causal attention"), probes)


# --- exercise 2: FLOPs per token ---------------------------------------------------------------

#: Configs that change one size at a time from the defaults, then several, then the levers.
_FLOP_CONFIGS = (
    GPTConfig(),
    GPTConfig(n_layer=3),
    GPTConfig(d_model=96, n_head=3),
    GPTConfig(n_head=8),
    GPTConfig(seq_len=64),
    GPTConfig(vocab_size=97),
    GPTConfig(n_layer=1, n_head=2, d_model=48, seq_len=40, vocab_size=97),
    GPTConfig(n_layer=2, n_head=4, d_model=64, seq_len=32, attention="sdpa", checkpoint=True),
)


def _flop_mistakes(model: GPT) -> list[tuple[float, str]]:
    """(what a typical wrong count returns, the hint that names the mistake) (chapter 7)."""
    cfg = model.cfg
    n, lay, t, d = non_embedding_params(model), cfg.n_layer, cfg.seq_len, cfg.d_model
    attn, wpe, head = 12 * lay * t * d, model.wpe.weight.numel(), cfg.vocab_size * d
    biases = sum(p.numel() for name, p in model.named_parameters() if name.endswith("bias"))
    norms = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.LayerNorm))
    forward = tr(
        "you counted the forward pass only: training also runs backward, which costs twice "
        "the forward, so 6N in all (2N forward + 4N backward), and 12 (not 4) for attention."
    )
    return [
        (2 * n, forward),
        (2 * n + attn / 3, forward),
        (2 * n + attn, forward),
        (
            6 * n,
            tr(
                "the attention term is missing: q @ k^T and weights @ v cost "
                "12 * n_layer * seq_len * d_model per token (forward and backward), on top of 6N."
            ),
        ),
        (
            6 * n + attn * t,
            tr(
                "per token the attention term is 12 * n_layer * seq_len * d_model: each token's "
                "query meets seq_len keys, so it is linear in seq_len (seq_len**2 is per sequence)."
            ),
        ),
        (
            6 * n + attn / 2,
            tr(
                "the standard estimate counts the full seq_len x seq_len scores "
                "(12 * n_layer * seq_len * d_model); do not halve it for the mask."
            ),
        ),
        (
            6 * n + attn // cfg.n_head,
            tr("the attention term uses d_model (all heads together), not head_dim."),
        ),
        (
            6 * (n + wpe) + attn,
            tr(
                "you counted the position embedding: a token only reads its one row of it (a "
                "lookup, no multiply), so leave model.wpe out of N."
            ),
        ),
        (
            6 * (n + head) + attn,
            tr(
                "you counted the head twice: it is tied to the token embedding (one tensor), and "
                "model.state_dict() lists it as both head.weight and wte.weight. Count "
                "model.parameters(), which lists a shared tensor once."
            ),
        ),
        (
            6 * (n + head + wpe) + attn,
            tr(
                "you counted the head twice (state_dict() lists the tied head.weight and "
                "wte.weight separately, model.parameters() once) and the position embedding, "
                "which is a lookup, not a multiply: leave model.wpe out."
            ),
        ),
        (
            6 * (n - head) + attn,
            tr(
                "you left out the token embedding; it is also the head (tied weights), a "
                "d_model x vocab matmul every token goes through: count it once."
            ),
        ),
        (
            6 * (n - biases) + attn,
            tr("you left out the biases: N is every parameter but the position embedding."),
        ),
        (
            6 * (n - norms) + attn,
            tr(
                "you left out the LayerNorm weights: N is every parameter but the position "
                "embedding."
            ),
        ),
    ]


def _flops_untouched(fn: Callable[[GPT], Any], model: GPT) -> Any:
    """Call the learner's flops_per_token; fail if it ran, trained, moved or cast the model (chapter 7)."""
    weights = [(p.detach().clone(), p.requires_grad) for p in model.parameters()]
    got = fn(model)
    params = list(model.parameters())
    expect(
        len(params) == len(weights)
        and all(p.device == w.device and p.dtype == w.dtype for p, (w, _) in zip(params, weights)),
        tr("your function moved or cast the caller's model: count from its parameters and config."),
    )
    expect(
        all(p.grad is None for p in params),
        tr(
            "your function ran backward on the caller's model (its .grad are set): count from the "
            "parameters and model.cfg, run nothing."
        ),
    )
    expect(
        all(torch.equal(p, w) and p.requires_grad == rg for p, (w, rg) in zip(params, weights)),
        tr("your function changed the caller's model (weights or requires_grad)."),
    )
    return got


def _flops_hint(got: float, model: GPT, want: int, first_right: bool) -> str:
    """The hint for a wrong FLOPs-per-token count (chapter 7)."""
    cfg = model.cfg
    where = tr("for {cfg} you returned {got:,}, expected {want:,}: ").format(
        cfg=cfg, got=got, want=want
    )
    for wrong, hint in _flop_mistakes(model):
        if math.isclose(got, wrong, rel_tol=1e-9):
            return where + hint
    if first_right:
        changed = [
            f"{f}={getattr(cfg, f)}"
            for f in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size")
            if getattr(cfg, f) != getattr(GPTConfig(), f)
        ]
        return where + tr(
            "right for the default config but wrong with {changed}: is a size "
            "hard-coded? Read every size from model.cfg and count model.parameters()."
        ).format(changed=", ".join(changed))
    return where + tr(
        "6N + 12 * n_layer * seq_len * d_model, with N = every parameter except the position "
        "embedding, the tied head counted once."
    )


def _flop_counter_per_token(cfg: GPTConfig, batch: int = 2) -> float:
    """FlopCounterMode's FLOPs per token for forward + backward of the manual-attention GPT, on meta (chapter 7)."""
    model = make_gpt(replace(cfg, attention="manual", checkpoint=False), device="meta")
    idx = torch.zeros(batch, cfg.seq_len, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        model(idx, idx).backward()
    return counter.get_total_flops() / (batch * cfg.seq_len)


def check_flops_per_token(fn: Callable[[GPT], float]) -> CheckResult:
    """Exercise 2: 6N + 12·layers·seq·d over several configs, the model untouched, near FlopCounterMode (chapter 7)."""
    seen: dict[str, float] = {}

    def probes() -> None:
        first_right = False
        for n, cfg in enumerate(_FLOP_CONFIGS):
            model = make_gpt(cfg, seed=n)
            with probe(f"{cfg}"):
                got = _flops_untouched(fn, model)
            expect(
                isinstance(got, numbers.Real) and not isinstance(got, bool),
                tr("return the FLOPs per token as a number, not {type}.").format(
                    type=type(got).__name__
                ),
            )
            want = flops_per_token(model)
            if not math.isclose(got, want, rel_tol=1e-12, abs_tol=0.5):
                raise CheckFailed(_flops_hint(got, model, want, first_right))
            first_right = first_right or n == 0
        cfg = GPTConfig(n_layer=2, n_head=4, d_model=128, seq_len=256)
        counted = _flop_counter_per_token(cfg)
        seen.update(counted=counted, estimate=float(fn(make_gpt(cfg))))
        expect(
            abs(seen["estimate"] / counted - 1) <= 0.10,
            tr(
                "FlopCounterMode counted {counted:,.0f} FLOPs per token for forward + backward of "
                "{cfg}, your estimate is {estimate:,.0f}: more than 10% apart."
            ).format(counted=counted, cfg=cfg, estimate=seen["estimate"]),
        )

    result = run_check(tr("Exercise 2, FLOPs per token"), probes)
    if result.passed:
        gap = seen["estimate"] / seen["counted"] - 1
        line = (
            tr(
                "FlopCounterMode, forward + backward of the manual-attention GPT: "
                "{counted:,.0f} FLOPs per token; the estimate {estimate:,.0f} is {gap:.1%} above "
                "it (biases and LayerNorms are in N but do no matmul)."
            )
            if gap > 0
            else tr(
                "FlopCounterMode, forward + backward of the manual-attention GPT: "
                "{counted:,.0f} FLOPs per token; the estimate {estimate:,.0f} is {gap:.1%} below "
                "it (biases and LayerNorms are in N but do no matmul)."
            )
        )
        print("   " + line.format(counted=seen["counted"], estimate=seen["estimate"], gap=abs(gap)))
    return result


# --- exercise 3: gradient accumulation on the GPT ----------------------------------------------

_SMALL = GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=16)


def _tokens(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of n random token sequences and their targets, (n, seq_len) each (chapter 7)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, _SMALL.vocab_size, (n, _SMALL.seq_len), generator=g)
    return x, torch.randint(0, _SMALL.vocab_size, (n, _SMALL.seq_len), generator=g)


def _grads_of(model: GPT, x: torch.Tensor, y: torch.Tensor, divide: int = 1) -> tuple[list, float]:
    """The .grad of every parameter after one backward of model(x, y) / divide, from zero (chapter 7)."""
    model.zero_grad(set_to_none=True)
    loss = model(x, y)
    (loss / divide).backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads, loss.item()


def _same(got: list, want: list) -> bool:
    """Every gradient close to the reference one (chapter 7)."""
    return all(torch.allclose(g, w, rtol=1e-4, atol=1e-7) for g, w in zip(got, want))


@contextmanager
def _forward_sizes(model: nn.Module) -> Iterator[list[int]]:
    """The batch size of every call of `model` in the block (chapter 7)."""
    sizes: list[int] = []

    def record(module: nn.Module, args: tuple, kwargs: dict) -> None:
        idx = args[0] if args else kwargs.get("idx")
        sizes.append(idx.shape[0] if isinstance(idx, torch.Tensor) else -1)

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield sizes
    finally:
        handle.remove()


class _Saved:
    """A tensor autograd saved for backward, held so that its lifetime can be watched (chapter 7)."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


@contextmanager
def _earlier_activations_alive(model: nn.Module) -> Iterator[list[int]]:
    """At each forward of `model`, the bytes earlier forwards' saved tensors still hold (chapter 7).

    Every tensor autograd saves inside the block is packed into a ``_Saved`` that autograd
    keeps until backward frees it (or, with ``retain_graph=True``, until the graph itself goes).
    Parameters are left out: they live anyway.
    """
    held: list[weakref.ref] = []
    alive_at: list[int] = []
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor) -> _Saved:
        saved = _Saved(t)
        held.append(weakref.ref(saved))
        return saved

    def before(module: nn.Module, args: tuple, kwargs: dict) -> None:
        storages = {}
        for ref in held:
            saved = ref()
            if saved is not None and not saved.tensor.is_meta:
                storage = saved.tensor.untyped_storage()
                if storage.data_ptr() not in params:
                    storages[storage.data_ptr()] = storage.nbytes()
        alive_at.append(sum(storages.values()))

    handle = model.register_forward_pre_hook(before, with_kwargs=True)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved.tensor):
            yield alive_at
    finally:
        handle.remove()


def _accumulation_run(
    fn: Callable[..., Any], model: GPT, x: torch.Tensor, y: torch.Tensor, micro: int
) -> tuple[Any, list[int], list[str], SyncCounter]:
    """Run the learner's accumulation, inputs and weights checked; (result, sizes, events, syncs) (chapter 7)."""
    n = len(x)
    x0, y0 = x.clone(), y.clone()
    weights = [p.detach().clone() for p in model.parameters()]
    first = model.blocks[0].attn.qkv.weight
    with (
        probe(tr("batch {n}, micro_batches={micro}").format(n=n, micro=micro)),
        _forward_sizes(model) as sizes,
        work_order(model, first) as events,
        _earlier_activations_alive(model) as alive,
        SyncCounter() as syncs,
    ):
        got = fn(model, x, y, micro)
    where = tr("[probe: batch {n}, micro_batches={micro}] ").format(n=n, micro=micro)
    expect(
        torch.equal(x, x0) and torch.equal(y, y0),
        where + tr("you changed the caller's x or y."),
    )
    expect(
        all(torch.equal(p.detach(), w) for p, w in zip(model.parameters(), weights)),
        where + tr("the weights changed: accumulate gradients only, take no optimizer step."),
    )
    kept = next(((i, b) for i, b in enumerate(alive) if b), None)
    if kept and forwards_at_once(events) <= 1:  # several forwards at once get their own hint
        raise CheckFailed(
            where
            + tr(
                "when micro-batch {micro_batch} started, {nbytes:,} bytes of earlier "
                "micro-batches' activations were still alive: backward(retain_graph=True), or a "
                "loss kept with its graph, holds them, so every chunk's activations pile up as if "
                "unsplit. Call loss.backward() without retain_graph and keep only loss.detach()."
            ).format(micro_batch=kept[0] + 1, nbytes=kept[1])
        )
    return got, sizes, events, syncs


def _accumulation_grads_hint(model: GPT, got: list, want: list, x, y, micro: int) -> str:
    """The hint for accumulated gradients that differ from the whole batch's (chapter 7)."""
    scale = float(got[0].norm() / want[0].norm())
    hint = tr("your gradients are {scale:.3g}x the whole batch's.").format(scale=scale)
    if micro > 1 and math.isclose(scale, micro, rel_tol=0.02):
        return hint + tr(
            " Each micro-batch's loss is a mean over its own samples: divide it by "
            "micro_batches ({micro}) before backward()."
        ).format(micro=micro)
    last, _ = _grads_of(model, x.chunk(micro)[-1], y.chunk(micro)[-1], divide=micro)
    if micro > 1 and (_same(got, last) or _same([g / micro for g in got], last)):
        return hint + tr(
            " Only the last micro-batch's gradients are left: you zeroed the gradients "
            "between micro-batches. backward() adds into .grad; let it add them all up."
        )
    if micro > 1 and math.isclose(scale, 1 / micro, rel_tol=0.02):
        return hint + tr(" You divided by micro_batches ({micro}) twice.").format(micro=micro)
    return hint + tr(" Run forward and backward of each equal chunk, each loss / micro_batches.")


def _accumulation_probe(fn: Callable[..., Any], n: int, micro: int, zeros: bool) -> None:
    """One call of the learner's accumulation against the whole batch's gradients and loss (chapter 7)."""
    model = make_gpt(_SMALL, seed=micro)
    x, y = _tokens(n, seed=n + micro)
    want, loss = _grads_of(model, x, y)
    if zeros:  # gradients that exist and are zero, as after zero_grad(set_to_none=False)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    got, sizes, events, syncs = _accumulation_run(fn, model, x, y, micro)
    where = tr("[probe: batch {n}, micro_batches={micro}] ").format(n=n, micro=micro)
    expect(sizes, where + tr("your function never ran the model."))
    together = forwards_at_once(events)
    expect(together <= 1, where + one_backward_per_forward_hint(together))
    expect(
        sizes == [n // micro] * micro,
        where
        + tr(
            "the model ran on batches of {sizes}; split the batch into {micro} equal "
            "chunks of {chunk} (x.chunk(micro_batches)) and run each once."
        ).format(sizes=sizes, micro=micro, chunk=n // micro),
    )
    grads = [p.grad for p in model.parameters()]
    expect(
        all(g is not None for g in grads),
        where + tr("some parameters have no .grad afterwards."),
    )
    if not _same(grads, want):
        raise CheckFailed(where + _accumulation_grads_hint(model, grads, want, x, y, micro))
    expect(
        isinstance(got, float),
        where
        + tr(
            "return the batch's mean loss as a Python float, not {type}: "
            "keep each chunk's loss on the device and call .item() once at the end."
        ).format(type=type(got).__name__),
    )
    if not math.isclose(got, loss, rel_tol=1e-5):
        ratio = got / loss
        why = tr("return the mean loss of the whole batch: the sum of the divided chunk losses.")
        if micro > 1 and math.isclose(ratio, micro, rel_tol=1e-3):
            why = tr("that is the sum of the chunk means: divide each by micro_batches first.")
        raise CheckFailed(
            where
            + tr("you returned {got:.6g}, the batch's loss is {loss:.6g}: {why}").format(
                got=got, loss=loss, why=why
            )
        )
    expect(
        syncs.count <= 1,
        where
        + tr(
            "you made {count} host syncs ({kinds}); one is enough: keep each chunk's loss on the "
            "device (loss.detach()) and read the total once at the end."
        ).format(count=syncs.count, kinds=dict(syncs.by_kind())),
    )


def _expect_value_error(fn: Callable[..., Any], n: int, micro: Any) -> None:
    """fn(model, x, y, micro) must raise ValueError before running the model (chapter 7)."""
    model = make_gpt(_SMALL)
    x, y = _tokens(n, seed=0)
    what = tr("a batch of {n} with micro_batches={micro}").format(n=n, micro=micro)
    with _forward_sizes(model) as sizes:
        try:
            fn(model, x, y, micro)
        except ValueError:
            expect(
                not sizes,
                tr("[probe: {what}] check micro_batches before the first forward.").format(
                    what=what
                ),
            )
            return
        except Exception as exc:
            raise CheckFailed(
                tr(
                    "[probe: {what}] your code raised {error}: raise ValueError with "
                    "a message that says why (micro_batches < 1, or the batch does not split into "
                    "equal chunks)."
                ).format(what=what, error=type(exc).__name__)
            ) from None
    raise CheckFailed(
        tr(
            "[probe: {what}] nothing was raised: the batch does not split into {micro} equal "
            "micro-batches, so raise ValueError (x.chunk would quietly make other sizes)."
        ).format(what=what, micro=micro)
    )


def check_accumulate_micro_batches(fn: Callable[..., float]) -> CheckResult:
    """Exercise 3: micro-batch gradients and loss equal to the whole batch's, one backward per forward (chapter 7)."""

    def probes() -> None:
        for n, micro, zeros in ((8, 2, False), (8, 1, False), (8, 4, False), (12, 3, True)):
            _accumulation_probe(fn, n, micro, zeros)
        for n, micro in ((8, 3), (8, 0), (8, -2), (4, 8)):
            _expect_value_error(fn, n, micro)

    return run_check(tr("Exercise 3, gradient accumulation on the GPT"), probes)


# --- exercise 4: the largest batch under an activation budget -----------------------------------

_BUDGET_CONFIGS = (
    GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=16),
    GPTConfig(n_layer=2, n_head=2, d_model=32, seq_len=16, checkpoint=True),
    GPTConfig(n_layer=1, n_head=4, d_model=48, seq_len=24, vocab_size=128, checkpoint=True),
    GPTConfig(n_layer=3, n_head=4, d_model=48, seq_len=24, vocab_size=128),
)


@cache
def _meta_gpt(cfg: GPTConfig) -> GPT:
    """The GPT of `cfg` on the meta device, built once per config (chapter 7)."""
    return make_gpt(cfg, device="meta")


def _saved_bytes(cfg: GPTConfig, batch: int, way: str = "right") -> int:
    """Activation bytes of one forward at `batch`, measured 'right' (targets a tensor of their
    own), 'no targets', 'tokens as targets' or 'with parameters' (chapter 7)."""
    model = _meta_gpt(cfg)
    idx = torch.zeros(batch, cfg.seq_len, dtype=torch.long, device="meta")
    targets = idx if way == "tokens as targets" else torch.zeros_like(idx)
    with ActivationMeter(*(() if way == "with parameters" else (model,))) as meter:
        model(idx) if way == "no targets" else model(idx, targets)
    return meter.total_bytes


def _largest_by(cfg: GPTConfig, budget: int, way: str = "right") -> int:
    """The largest batch whose bytes, measured `way`, fit `budget`; 0 if none (chapter 7)."""
    if _saved_bytes(cfg, 1, way) > budget:
        return 0
    return find_max_batch(lambda b: _saved_bytes(cfg, b, way) <= budget).largest


def _budget_hint(got: int, want: int, cfg: GPTConfig, budget: int) -> str:
    """The hint for a wrong largest batch (chapter 7)."""
    at = {b: _saved_bytes(cfg, b) for b in (want, want + 1) if b > 0}
    where = tr(
        "[probe: {cfg}, budget {budget:,} bytes] you returned {got}, expected {want}: "
    ).format(cfg=cfg, budget=budget, got=got, want=want)
    # First: its answers are one above the right ones near a budget's edge, as an off-by-one is.
    if got == _largest_by(cfg, budget, "tokens as targets"):
        return where + tr(
            "you passed the tokens as their own targets, model(idx, idx): one tensor, counted "
            "once. A training batch's targets are a tensor of their own (the next tokens), which "
            "the loss saves too: make targets = torch.zeros_like(idx) and call model(idx, targets)."
        )
    if got == want + 1:
        return where + tr(
            "batch {batch} saves {nbytes:,} bytes, more than the budget: you returned the first "
            "batch that does NOT fit. Return the last one that does."
        ).format(batch=got, nbytes=at[got])
    if got == want - 1:
        return where + tr(
            "batch {batch} saves {nbytes:,} bytes, which is at most the budget, so it fits "
            "(<=, not <): yours is one too small."
        ).format(batch=want, nbytes=at[want])
    if cfg.checkpoint and got == _largest_by(replace(cfg, checkpoint=False), budget):
        return where + tr(
            "that is the answer without checkpointing, but this cfg has checkpoint=True: build "
            "the model from the cfg you are given, make_gpt(cfg, device='meta')."
        )
    if got == _largest_by(cfg, budget, "no targets"):
        return where + tr(
            "you measured a forward without targets: call model(idx, targets), so the loss's "
            "saved tensors count too."
        )
    if got == _largest_by(cfg, budget, "with parameters"):
        return where + tr(
            "you counted the parameters as activations: pass the model to the meter, "
            "ActivationMeter(model), so its parameters are left out."
        )
    return where + tr(
        "measure one forward of make_gpt(cfg, device='meta') on (batch, cfg.seq_len) tokens "
        "and targets of their own under ActivationMeter(model), and keep the largest batch with "
        "total_bytes <= budget_bytes."
    )


#: The most forwards one call may run, as exercise 4 states: doubling then bisection needs
#: about 2 * log2(answer) + 2 (22 for an answer near 500), stepping one batch at a time one per batch.
FORWARD_LIMIT = 64


@contextmanager
def _gpt_forwards(limit: int = FORWARD_LIMIT) -> Iterator[list[set[torch.device]]]:
    """The devices of the tensors of every GPT forward in the block, positional or by name;
    fail past `limit` forwards (chapter 7)."""
    devices: list[set[torch.device]] = []
    real = GPT.forward

    def spy(self: GPT, *args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        devices.append({t.device for t in tensors})
        if len(devices) > limit:
            raise CheckFailed(
                tr(
                    "you ran more than {limit} forwards in one call, the most this exercise "
                    "allows: doubling the batch until it does not fit, then bisecting, needs about "
                    "2 * log2(answer) forwards (helpers.max_batch.find_max_batch does both); "
                    "trying one batch size after another needs one forward per size."
                ).format(limit=limit)
            )
        return real(self, *args, **kwargs)

    with mock.patch.object(GPT, "forward", spy):
        yield devices


def _budget_probe(
    fn: Callable[[GPTConfig, int], int], cfg: GPTConfig, batch: int, below: bool = True
) -> None:
    """A budget exactly at `batch`'s bytes and, if `below`, one byte below it (chapter 7)."""
    exact = _saved_bytes(cfg, batch)
    for budget, want in ((exact, batch), (exact - 1, batch - 1))[: 2 if below else 1]:
        name = tr("{cfg}, budget {budget:,} bytes").format(cfg=cfg, budget=budget)
        with probe(name), _gpt_forwards() as devices:
            got = fn(cfg, budget)
        where = tr("[probe: {name}] {text}").format(name=name, text="")
        expect(
            isinstance(got, numbers.Integral) and not isinstance(got, bool),
            where
            + tr("return the batch size as an integer, not {type}.").format(
                type=type(got).__name__
            ),
        )
        if got != want:
            raise CheckFailed(_budget_hint(int(got), want, cfg, budget))
        used = set().union(*devices) if devices else set()
        expect(
            all(d.type == "meta" for d in used),
            where
            + tr(
                "your forwards ran on {devices}: build the model and the tokens on the meta "
                "device (make_gpt(cfg, device='meta')), which measures shapes and uses no memory."
            ).format(devices=sorted(str(d) for d in used)),
        )


def _too_small_probe(fn: Callable[[GPTConfig, int], int], cfg: GPTConfig) -> None:
    """A budget below batch 1's bytes must raise ValueError (chapter 7)."""
    budget = _saved_bytes(cfg, 1) - 1
    where = tr("[probe: {cfg}, budget {budget:,} bytes, below batch 1's] ").format(
        cfg=cfg, budget=budget
    )
    try:
        with _gpt_forwards():
            got = fn(cfg, budget)
    except ValueError:
        return
    except CheckFailed as exc:
        raise CheckFailed(where + str(exc)) from None
    except Exception as exc:
        raise CheckFailed(
            where
            + tr(
                "your code raised {error}; raise ValueError, saying that not even batch 1 fits."
            ).format(error=type(exc).__name__)
        ) from None
    raise CheckFailed(
        where
        + tr(
            "you returned {got!r}: when not even batch 1 fits, raise ValueError (no batch "
            "size is an answer; 0 would crash the caller's training later)."
        ).format(got=got)
    )


@cache
def _meta_checkpoint_runs() -> bool:
    """Whether torch.utils.checkpoint runs on the meta device with this torch (2.5 and later) (chapter 7)."""
    try:
        _saved_bytes(replace(_BUDGET_CONFIGS[0], checkpoint=True), 1)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return True


def check_largest_gpt_batch(fn: Callable[[GPTConfig, int], int]) -> CheckResult:
    """Exercise 4: the largest batch whose saved activations fit a budget, checkpointing on and off (chapter 7)."""

    def probes() -> None:
        for cfg, batch in zip(_BUDGET_CONFIGS, (37, 37, 500, 150)):
            if cfg.checkpoint and not _meta_checkpoint_runs():
                continue  # an old torch: checkpoint() cannot run on meta tensors
            _budget_probe(fn, cfg, batch, below=batch < 100)
        _budget_probe(fn, _BUDGET_CONFIGS[0], 1, below=False)
        for cfg in _BUDGET_CONFIGS[: 2 if _meta_checkpoint_runs() else 1]:
            _too_small_probe(fn, cfg)

    return run_check(tr("Exercise 4, the largest batch that fits"), probes)
