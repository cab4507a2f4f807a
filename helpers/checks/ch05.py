"""Checkers for the chapter 5 exercises (GPU memory) (chapter 5).

Each ``check_*`` takes the learner's function, measures what it does with real tensors (the
activation meter, real gradients, real allocations) and prints ✅, ❌ with a hint, or ⏳ for
an untouched stub. None of them raises. Everything runs on the CPU in a second or two.
"""

from __future__ import annotations

import gc
import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from helpers.activations import measure_activation_bytes
from helpers.checks import (
    CheckFailed,
    CheckResult,
    expect,
    forwards_at_once,
    one_backward_per_forward_hint,
    probe,
    run_check,
    work_order,
)
from helpers.i18n import tr
from helpers.memory_bill import measure_training_memory
from helpers.models import make_mlp, wide_mlp_sizes

_KEYS = ("parameters", "gradients", "optimizer_state", "activations")


def _probed(name: str, text: str) -> str:
    """A hint prefixed with the probe it comes from, as probe() writes it (chapter 5)."""
    return tr("[probe: {name}] {text}").format(name=name, text=text)


def _relu_mlp(sizes: list[int], seed: int, bias: bool = True) -> nn.Sequential:
    """A flat Linear, ReLU, ..., Linear stack through `sizes` (chapter 5)."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b, bias=bias))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


#: (layer widths, batch, bias): odd batches, one Linear alone, Linears without bias.
_BILL_PROBES = (
    ([32, 64, 64, 10], 16, True),
    ([20, 128, 10], 50, True),
    ([48, 96, 96, 96, 3], 7, True),
    ([24, 40, 8], 9, False),
    ([16, 4], 1, True),
)


def _bill_untouched(
    fn: Callable[[nn.Sequential, int], Any], model: nn.Sequential, batch: int
) -> Any:
    """Call the learner's training_bill; fail if it trained, moved or cast the model (chapter 5)."""
    weights = [p.detach().clone() for p in model.parameters()]
    got = fn(model, batch)
    params = list(model.parameters())
    expect(
        all(p.device == w.device and p.dtype == w.dtype for p, w in zip(params, weights)),
        tr(
            "your function moved or cast the caller's model: compute the bill from the layer "
            "sizes, leave the model as it is."
        ),
    )
    expect(
        all(p.grad is None for p in params)
        and all(torch.equal(p, w) for p, w in zip(params, weights)),
        tr(
            "your function ran backward or an optimizer step on the caller's model (its weights "
            "or .grad changed): compute the bill from the layer sizes, train nothing."
        ),
    )
    expect(all(p.requires_grad for p in params), tr("your function turned off requires_grad."))
    return got


def _expect_bill(got: dict, want: dict, model: nn.Sequential, mlp: str, batch: int) -> None:
    """Each entry of the learner's bill equals the bytes measured on real tensors (chapter 5)."""
    n = sum(p.numel() for p in model.parameters())
    expect(
        got["parameters"] == want["parameters"],
        tr(
            "parameters for the MLP {sizes} at batch {batch}: you said {got}, the model "
            "holds {want} bytes ({n} fp32 numbers, 4 bytes each)."
        ).format(sizes=mlp, batch=batch, got=got["parameters"], want=want["parameters"], n=n),
    )
    expect(
        got["gradients"] == want["gradients"],
        tr(
            "gradients for the MLP {sizes} at batch {batch}: you said {got}, backward made "
            "{want} bytes (one gradient per parameter, same dtype)."
        ).format(sizes=mlp, batch=batch, got=got["gradients"], want=want["gradients"]),
    )
    expect(
        got["optimizer_state"] == want["optimizer_state"],
        tr(
            "optimizer state for the MLP {sizes} at batch {batch}: you said {got}, Adam "
            "holds {want} bytes: exp_avg and exp_avg_sq (2 fp32 copies) plus one 4-byte "
            "step counter per parameter TENSOR (len(list(model.parameters())): a Linear "
            "without bias has one, not two)."
        ).format(
            sizes=mlp,
            batch=batch,
            got=got["optimizer_state"],
            want=want["optimizer_state"],
        ),
    )
    expect(
        got["activations"] == want["activations"],
        tr(
            "activations for the MLP {sizes} at batch {batch}: you said {got}, the meter "
            "measured {want} bytes. The first Linear keeps the input batch; each ReLU "
            "keeps its output (which is also what the next Linear keeps: count it once); "
            "a Linear's output is not kept when a ReLU follows."
        ).format(sizes=mlp, batch=batch, got=got["activations"], want=want["activations"]),
    )


def check_training_bill(fn: Callable[[nn.Sequential, int], dict[str, int]]) -> CheckResult:
    """Exercise 1: the fp32 + Adam training bill of an MLP, compared with real tensors and the meter (chapter 5)."""

    def probes() -> None:
        for sizes, batch, bias in _BILL_PROBES:
            model = _relu_mlp(sizes, seed=batch, bias=bias)
            mlp = "-".join(map(str, sizes))
            with probe(
                tr("MLP {sizes}, batch {batch}, bias={bias}").format(
                    sizes=mlp, batch=batch, bias=bias
                )
            ):
                got = _bill_untouched(fn, model, batch)
            expect(
                isinstance(got, dict),
                tr("return a dict with keys {keys}, not {kind}.").format(
                    keys=_KEYS, kind=type(got).__name__
                ),
            )
            missing = [k for k in _KEYS if k not in got]
            expect(
                not missing,
                tr("your dict lacks {missing}; return all of {keys}, in bytes.").format(
                    missing=missing, keys=_KEYS
                ),
            )
            opt = torch.optim.Adam(model.parameters())
            x, y = torch.randn(batch, sizes[0]), torch.randint(0, sizes[-1], (batch,))
            real = measure_training_memory(model, opt, nn.functional.cross_entropy, x, y)
            want = dict(
                zip(
                    _KEYS, (real.parameters, real.gradients, real.optimizer_state, real.activations)
                )
            )
            for key in _KEYS:
                expect(
                    isinstance(got[key], (int, float)) and not isinstance(got[key], bool),
                    tr("{key} must be a number of bytes, got {got!r}.").format(
                        key=key, got=got[key]
                    ),
                )
            _expect_bill(got, want, model, mlp, batch)

    return run_check(tr("Exercise 1: the training bill"), probes)


def _grads(model: nn.Module) -> list[torch.Tensor | None]:
    """Copies of every parameter's .grad (None stays None) (chapter 5)."""
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def _run_accumulation(
    fn: Callable[..., Any],
    model: nn.Sequential,
    loss_fn: Callable[..., torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    micro: int,
) -> tuple[list[int], list[str]]:
    """Run the learner's accumulation; the forward batch sizes and the forward/backward order (chapter 5)."""
    largest: list[int] = []

    def record(module: nn.Module, args: tuple[Any, ...], sizes: list[int] = largest) -> None:
        sizes.append(args[0].shape[0])

    hooks = [model.register_forward_pre_hook(record)]
    weights = [p.detach().clone() for p in model.parameters()]
    x_before, y_before = x.clone(), y.clone()
    name = tr("{n} samples, micro_batch={micro}").format(n=len(x), micro=micro)
    try:
        with probe(name), work_order(model, model[0].weight) as events:
            fn(model, loss_fn, x, y, micro)
    finally:
        for h in hooks:
            h.remove()
    expect(
        torch.equal(x, x_before) and torch.equal(y, y_before),
        _probed(name, tr("your function changed the caller's x or y.")),
    )
    expect(
        all(torch.equal(p.detach(), w) for p, w in zip(model.parameters(), weights)),
        _probed(
            name, tr("the weights changed: accumulate gradients only, take no optimizer step.")
        ),
    )
    return largest, events


def check_accumulate_gradients(
    fn: Callable[[nn.Module, Callable[..., torch.Tensor], torch.Tensor, torch.Tensor, int], Any],
) -> CheckResult:
    """Exercise 2: micro-batch gradients equal to the whole batch's, uneven splits included (chapter 5)."""

    def probes() -> None:
        loss_fn = nn.CrossEntropyLoss()
        for n, micro in ((64, 16), (50, 16), (30, 30), (9, 4)):
            torch.manual_seed(n)
            model = _relu_mlp([12, 32, 5], seed=n)
            x, y = torch.randn(n, 12), torch.randint(0, 5, (n,))
            model.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            want = _grads(model)
            for p in model.parameters():  # stale gradients the learner must clear first
                p.grad = torch.full_like(p, 7.0)
            largest, events = _run_accumulation(fn, model, loss_fn, x, y, micro)
            name = tr("{n} samples, micro_batch={micro}").format(n=n, micro=micro)
            expect(largest, _probed(name, tr("your function never ran the model.")))
            together = forwards_at_once(events)
            expect(together <= 1, _probed(name, one_backward_per_forward_hint(together)))
            expect(
                max(largest) <= micro,
                tr(
                    "with micro_batch={micro} you ran a forward on {largest} samples at once: "
                    "the point is never to hold more than one micro-batch of activations."
                ).format(micro=micro, largest=max(largest)),
            )
            expect(
                sum(largest) == n,
                tr(
                    "the micro-batches covered {covered} samples, but the batch has {n}: "
                    "use every sample exactly once."
                ).format(covered=sum(largest), n=n),
            )
            got = _grads(model)
            expect(all(g is not None for g in got), tr("some parameters have no .grad afterwards."))
            expect(
                not torch.allclose(got[0], want[0] + 7.0, atol=1e-5),
                tr(
                    "the gradients still contain the old values: clear them before accumulating "
                    "(model.zero_grad(set_to_none=True))."
                ),
            )
            ok = all(torch.allclose(g, w, rtol=1e-4, atol=1e-6) for g, w in zip(got, want))
            if not ok:
                scale = float(got[0].norm() / want[0].norm())
                steps = math.ceil(n / micro)
                hint = tr(
                    "for {n} samples in micro-batches of {micro}, your gradients are {scale:.3g}x "
                    "the whole batch's."
                ).format(n=n, micro=micro, scale=scale)
                if abs(scale - steps) < 0.05 * steps:
                    hint += tr(" Each micro-batch's loss is a mean: scale it before backward().")
                elif n % micro:
                    hint += tr(
                        " The last micro-batch is smaller: weight each loss by "
                        "len(micro-batch) / len(batch), not 1 / number of steps."
                    )
                expect(False, hint)

    return run_check(tr("Exercise 2: gradient accumulation"), probes)


def _activation_change(plain: int, saved: int) -> str:
    """How the activation bytes changed, in words: cut by how much, unchanged, or grown (chapter 5)."""
    cut = 1 - saved / plain
    if abs(cut) < 0.005:  # not "went from 0.44 MiB to 0.44 MiB, a cut of 0%"
        what = tr("activation bytes stayed at {plain:.2f} MiB (no cut)")
    elif cut < 0:
        what = tr("activation bytes grew from {plain:.2f} MiB to {saved:.2f} MiB")
    else:
        what = tr(
            "activation bytes went from {plain:.2f} MiB to {saved:.2f} MiB, a cut of {cut:.0%}"
        )
    return what.format(plain=plain / 2**20, saved=saved / 2**20, cut=cut)


def check_forward_low_memory(
    fn: Callable[[nn.Sequential, torch.Tensor], torch.Tensor], min_cut: float = 0.4
) -> CheckResult:
    """Exercise 3: checkpointing that cuts activation bytes by `min_cut`, same output and gradients (chapter 5)."""

    class _Wrapped(nn.Module):
        """The learner's forward as a module, so the meter excludes the right parameters (chapter 5)."""

        def __init__(self, model: nn.Sequential) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return fn(self.model, x)

    def probes() -> None:
        torch.manual_seed(0)
        model = make_mlp(wide_mlp_sizes(256, 6, 10), blocks=True)
        x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
        plain = measure_activation_bytes(model, x)
        model.zero_grad(set_to_none=True)
        want_out = model(x)
        nn.functional.cross_entropy(want_out, y).backward()
        want = _grads(model)
        model.zero_grad(set_to_none=True)
        structure = [(name, id(m)) for name, m in model.named_modules()]
        params = [id(p) for p in model.parameters()]
        got_out = fn(model, x)
        expect(
            [(name, id(m)) for name, m in model.named_modules()] == structure
            and [id(p) for p in model.parameters()] == params,
            tr(
                "your function changed the caller's model (replaced or wrapped its layers): "
                "checkpoint inside the forward, leave the model as it is."
            ),
        )
        expect(
            isinstance(got_out, torch.Tensor),
            tr("return the model's output, not {kind}.").format(kind=type(got_out).__name__),
        )
        expect(
            got_out.shape == want_out.shape and torch.allclose(got_out, want_out, atol=1e-6),
            tr("your output differs from model(x): checkpointing must not change the result."),
        )
        nn.functional.cross_entropy(got_out, y).backward()
        got = _grads(model)
        missing = sum(g is None for g in got)
        expect(
            not missing,
            tr(
                "{missing} parameter tensors got no gradient. With use_reentrant=True and an "
                "input that does not require grad, a checkpointed segment's weights get none: "
                "use use_reentrant=False."
            ).format(missing=missing),
        )
        expect(
            all(torch.allclose(g, w, rtol=1e-5, atol=1e-7) for g, w in zip(got, want)),
            tr("the gradients differ from the plain model's."),
        )
        saved = measure_activation_bytes(_Wrapped(model), x)
        expect(
            1 - saved / plain >= min_cut - 1e-9,
            tr(
                "{what}; at least a cut of {min_cut:.0%} is needed. Checkpointing each "
                "Linear+ReLU block alone saves nothing (a block keeps only its input anyway): "
                "checkpoint segments of several blocks, so only each segment's input is kept."
            ).format(what=_activation_change(plain, saved), min_cut=min_cut),
        )

    return run_check(tr("Exercise 3: place the checkpoints"), probes)


def check_largest_batch(fn: Callable[[Callable[[int], bool], int], int]) -> CheckResult:
    """Exercise 4: doubling then binary search, correct at the edges and with few probes (chapter 5)."""

    def probes() -> None:
        cases = [(4096, m) for m in (1, 2, 3, 100, 1000, 1024, 1025, 4095, 4096)]
        cases += [(1000, m) for m in (999, 1000, 500, 513)] + [(1, 1), (3, 2), (3, 3)]
        for limit, true_max in cases:
            budget = 2 * math.ceil(math.log2(limit)) + 2 if limit > 1 else 1
            calls: list[int] = []

            def fits(batch: int, m: int = true_max, calls: list[int] = calls) -> bool:
                calls.append(batch)
                return batch <= m

            got = fn(fits, limit)
            expect(
                got == true_max,
                tr(
                    "when batches up to {true_max} fit (limit {limit}) you returned {got!r}. "
                    "Keep the last size that fitted and the first that did not, and search "
                    "between."
                ).format(true_max=true_max, limit=limit, got=got),
            )
            expect(
                len(calls) <= budget,
                tr(
                    "you called fits {calls} times to find {true_max}; doubling then binary "
                    "search needs at most {budget}. Do not step one by one."
                ).format(calls=len(calls), true_max=true_max, budget=budget),
            )
            expect(
                all(1 <= b <= limit for b in calls),
                tr("you tried batch sizes outside 1..{limit}: {tried}...").format(
                    limit=limit, tried=sorted(set(calls))[:5]
                ),
            )
        for limit in (4096, 1000, 1):
            with probe(tr("nothing fits, limit {limit}").format(limit=limit)):
                expect(fn(lambda b: False, limit) == 0, tr("when not even batch 1 fits, return 0."))

    return run_check(tr("Exercise 4: the largest batch that fits"), probes)


def _expect_propagates(fn: Callable[[Callable[[int], Any], int], bool]) -> None:
    """A RuntimeError that is not out-of-memory (a shape bug) must reach the caller (chapter 5)."""

    def shape_bug(batch: int) -> None:
        torch.ones(batch, 3) @ torch.ones(4, 2)  # mat1 and mat2 shapes cannot be multiplied

    try:
        got = fn(shape_bug, 8)
    except RuntimeError:
        return
    raise CheckFailed(
        _probed(
            tr("a RuntimeError that is not out-of-memory"),
            tr(
                "a shape mismatch in the step was swallowed (you returned {got!r}): catching "
                "every RuntimeError hides bugs. Re-raise unless "
                "helpers.sweeps.is_out_of_memory(exc) is true."
            ).format(got=got),
        )
    )


def check_safe_step(fn: Callable[[Callable[[int], Any], int], bool]) -> CheckResult:
    """Exercise 5: out-of-memory gives False and frees the failed step's tensors; other errors propagate (chapter 5)."""

    def probes() -> None:
        seen: dict[str, weakref.ref[torch.Tensor]] = {}

        def failing_step(batch: int) -> None:
            activations = torch.ones(batch, 1024)
            seen["ref"] = weakref.ref(activations)
            torch.empty(2**60, dtype=torch.uint8)  # impossible: 1 EiB

        got = fn(failing_step, 256)
        expect(
            got is False,
            tr("after an out-of-memory error return False, not {got!r}.").format(got=got),
        )
        gc.collect()
        expect(
            seen["ref"]() is None,
            tr(
                "the failed step's tensors are still alive: something still references the "
                "exception or its traceback (a variable, a list, a global). Keep only a message."
            ),
        )
        calls: list[int] = []
        expect(
            fn(lambda b: calls.append(b) or torch.zeros(b).sum(), 8) is True,
            tr("when the step runs, return True."),
        )
        expect(
            calls == [8],
            tr(
                "step(batch) ran {n} times with {calls}: call it once, with the batch given."
            ).format(n=len(calls), calls=calls),
        )
        _expect_propagates(fn)

        def buggy_step(batch: int) -> None:
            raise ValueError("a bug, not out-of-memory")

        try:
            fn(buggy_step, 8)
        except ValueError:
            pass
        else:
            expect(
                False,
                tr(
                    "a step that raised ValueError (a bug) was swallowed: catch only "
                    "out-of-memory errors and re-raise everything else."
                ),
            )

    return run_check(tr("Exercise 5: survive out-of-memory"), probes)
