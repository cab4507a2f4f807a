"""Chapter 7 checkers fail typical wrong answers with their own hint (solution/stub: test_exercise_checks.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from helpers.activations import ActivationMeter
from helpers.checks import FAIL
from helpers.checks.ch07 import (
    check_accumulate_micro_batches,
    check_causal_attention,
    check_flops_per_token,
    check_largest_gpt_batch,
)
from helpers.gpt import make_gpt, manual_attention
from helpers.max_batch import find_max_batch

from nbfiles import exercise_namespace

SOLUTIONS = "solutions/07_capstone_solutions.ipynb"


@pytest.fixture(scope="module")
def solutions() -> dict:
    return exercise_namespace(SOLUTIONS)


def fails(result, *words: str) -> bool:
    return result.status == FAIL and all(w in result.message for w in words)


# --- exercise 1: causal attention ---------------------------------------------------------------


def attention(q, k, v, *, scale=None, hide="future", fill=float("-inf"), dim=-1, device=None):
    """A written-out attention with one knob turned the wrong way."""
    t = q.size(-2)
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    ones = torch.ones(t, t, dtype=torch.bool, device=q.device if device is None else device)
    hidden = {
        "future": ones.triu(1),
        "past": ones.tril(-1),
        "future+self": ones.triu(),
        "past+self": ones.tril(),  # masked_fill(torch.tril(...)): the mask inverted
    }
    scores = q @ k.transpose(-2, -1) * scale
    if hide != "nothing":
        scores = scores.masked_fill(hidden[hide], fill)
    return torch.softmax(scores, dim=dim) @ v


def calls_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def calls_sdpa_imported(q, k, v):
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    return sdpa(q, k, v, is_causal=True)


def calls_the_cpu_flash_kernel(q, k, v):  # issue 24: another entry point to the same kernel
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True)[0]


def calls_the_math_kernel(q, k, v):  # issue 31: a composite, decomposed before dispatch
    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, is_causal=True)[0]


def calls_the_c_binding(q, k, v):
    return torch._C._nn.scaled_dot_product_attention(q, k, v, is_causal=True)


def softmax_without_the_max(q, k, v):  # issue 24: right until the scores overflow exp()
    t = q.size(-2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    e = scores.masked_fill(future, float("-inf")).exp()
    return (e / e.sum(-1, keepdim=True)) @ v


def calls_the_model_helper(q, k, v):
    return manual_attention(q, k, v)


def scales_in_place(q, k, v):
    q.mul_(1 / math.sqrt(q.size(-1)))
    return attention(q, k, v, scale=1.0)


def adds_a_float32_mask(q, k, v):
    t = q.size(-2)
    mask = torch.zeros(t, t, device=q.device).masked_fill(
        torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf")
    )
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + mask, dim=-1) @ v


def without_autograd(q, k, v):
    with torch.no_grad():
        return attention(q, k, v)


def flattens_with_view(q, k, v):
    b, h, t, d = q.shape
    out = attention(q.view(b * h, t, d), k.view(b * h, t, d), v.view(b * h, t, d))
    return out.view(b, h, t, d)


def mask_on_the_cpu(q, k, v):
    return attention(q, k, v, device="cpu")


def reads_values(q, k, v):
    if torch.isnan(q).any():  # a host read: there are no values on the meta device
        raise ValueError("NaN in q")
    return attention(q, k, v)


ATTENTION_MISTAKES = [
    (calls_sdpa, "Write it out"),
    (calls_sdpa_imported, "Write it out"),
    (calls_the_cpu_flash_kernel, "a fused attention kernel"),
    (
        calls_the_math_kernel,
        "PyTorch's own attention operator (aten _scaled_dot_product_attention_math)",
    ),
    (calls_the_c_binding, "Write it out"),
    (softmax_without_the_max, "Subtract each row's max before exp"),
    (calls_the_model_helper, "you called manual_attention"),
    (lambda q, k, v: attention(q, k, v, hide="nothing"), "not causal"),
    (lambda q, k, v: attention(q, k, v, hide="past"), "wrong side"),
    (lambda q, k, v: attention(q, k, v, hide="past+self"), "~torch.tril"),
    (lambda q, k, v: attention(q, k, v, hide="future+self"), "diagonal"),
    (lambda q, k, v: attention(q, k, v, fill=0.0), "float('-inf')"),
    (lambda q, k, v: attention(q, k, v, dim=-2), "dim=-1"),
    (lambda q, k, v: attention(q, k, v, scale=1.0), "not scaled"),
    (lambda q, k, v: attention(q, k, v, scale=1 / q.size(-2)), "sequence length"),
    (lambda q, k, v: attention(q, k, v, scale=q.size(-2) ** -0.5), "sqrt(sequence length)"),
    (lambda q, k, v: attention(q, k, v, scale=1 / q.size(-1)), "square root"),
    (lambda q, k, v: attention(q, k, v, scale=(q.size(1) * q.size(-1)) ** -0.5), "d_model"),
    (mask_on_the_cpu, "on q's device"),
    (lambda q, k, v: attention(q, k, v).float(), "float32 for torch.float64"),
    (scales_in_place, "in place"),
    (adds_a_float32_mask, "Keep q's dtype"),
    (without_autograd, "does not require grad"),
    (flattens_with_view, "transposed views"),
    (reads_values, "[probe: meta device] your code raised RuntimeError"),
    (lambda q, k, v: attention(q, k, v) + 0.01, "differs from F.scaled_dot_product_attention"),
]


@pytest.mark.parametrize(("wrong", "hint"), ATTENTION_MISTAKES)
def test_wrong_attentions_fail_with_their_hint(wrong, hint: str) -> None:
    result = check_causal_attention(wrong)
    assert fails(result, hint), result.message


def test_attention_other_correct_styles_pass() -> None:
    def with_where_and_tril(q, k, v):
        t = q.shape[-2]
        keep = torch.tril(torch.ones(t, t, device=q.device)).bool()
        scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        scores = torch.where(keep, scores, torch.full_like(scores, float("-inf")))
        return scores.softmax(-1) @ v

    def with_a_large_negative_fill(q, k, v):
        return attention(q, k, v, fill=-1e9)

    assert check_causal_attention(with_where_and_tril).passed
    assert check_causal_attention(with_a_large_negative_fill).passed


def test_a_torch_error_in_the_attention_is_reported_not_raised() -> None:
    result = check_causal_attention(lambda q, k, v: q @ k)  # (.., t, d) @ (.., t, d): no
    assert result.status == FAIL and "RuntimeError" in result.message


# --- exercise 2: FLOPs per token ----------------------------------------------------------------


def attention_term(model):
    cfg = model.cfg
    return 12 * cfg.n_layer * cfg.seq_len * cfg.d_model


def n_params(model):
    return sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()


def forward_only(model):
    return 2 * n_params(model) + attention_term(model) // 3


def no_attention(model):
    return 6 * n_params(model)


def seq_squared(model):
    return 6 * n_params(model) + attention_term(model) * model.cfg.seq_len


def with_position_embedding(model):
    return 6 * sum(p.numel() for p in model.parameters()) + attention_term(model)


def state_dict_without_wpe(model):
    n = sum(t.numel() for name, t in model.state_dict().items() if not name.startswith("wpe"))
    return 6 * n + attention_term(model)


def state_dict_all(model):
    return 6 * sum(t.numel() for t in model.state_dict().values()) + attention_term(model)


def vocab_hard_coded(model):
    cfg = model.cfg
    d = cfg.d_model
    n = cfg.n_layer * (12 * d * d + 13 * d) + 256 * d + 2 * d
    return 6 * n + attention_term(model)


def by_running_it(model):
    idx = torch.zeros(1, model.cfg.seq_len, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        model(idx, idx).backward()
    return counter.get_total_flops() / model.cfg.seq_len


def as_a_tensor(model):
    return torch.tensor(6 * n_params(model) + attention_term(model))


def without_biases(model):
    n = sum(p.numel() for name, p in model.named_parameters() if not name.endswith("bias"))
    return 6 * (n - model.wpe.weight.numel()) + attention_term(model)


def off_by_some(model):
    return 6 * n_params(model) + attention_term(model) + 1000


FLOP_MISTAKES = [
    (forward_only, "forward pass only"),
    (no_attention, "attention term is missing"),
    (seq_squared, "linear in seq_len"),
    (with_position_embedding, "counted the position embedding"),
    (state_dict_without_wpe, "counted the head twice"),
    (state_dict_all, "and the position embedding"),
    (vocab_hard_coded, "vocab_size=97"),
    (by_running_it, "ran backward"),
    (as_a_tensor, "as a number"),
    (without_biases, "left out the biases"),
    (off_by_some, "with N = every parameter except the position embedding"),
]


@pytest.mark.parametrize(("wrong", "hint"), FLOP_MISTAKES)
def test_wrong_flop_counts_fail_with_their_hint(wrong, hint: str) -> None:
    result = check_flops_per_token(wrong)
    assert fails(result, hint), result.message


def test_flops_success_line_compares_with_flop_counter(solutions, capsys) -> None:
    assert check_flops_per_token(solutions["flops_per_token"]).passed
    out = capsys.readouterr().out
    assert "FlopCounterMode" in out and "FLOPs per token" in out and "%" in out


def test_flops_as_a_numpy_integer_pass(solutions) -> None:
    """Issue 31: a NumPy integer is a number (numbers.Real): a right count in one is right."""
    import numpy as np

    right = solutions["flops_per_token"]
    assert check_flops_per_token(lambda model: np.int64(right(model))).passed
    result = check_flops_per_token(lambda model: np.array([right(model)]))
    assert fails(result, "as a number"), result.message


def test_flops_from_the_config_alone_passes() -> None:
    def analytic(model):
        cfg = model.cfg
        d, v = cfg.d_model, cfg.vocab_size
        n = cfg.n_layer * (12 * d * d + 13 * d) + v * d + 2 * d
        return 6 * n + 12 * cfg.n_layer * cfg.seq_len * d

    assert check_flops_per_token(analytic).passed


# --- exercise 3: gradient accumulation ----------------------------------------------------------


def validated(fn):
    def wrapper(model, x, y, micro_batches):
        if micro_batches < 1 or len(x) % micro_batches:
            raise ValueError("does not split")
        return fn(model, x, y, micro_batches)

    return wrapper


@validated
def undivided(model, x, y, micro):
    losses = []
    for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
        loss = model(xb, yb)
        loss.backward()
        losses.append(loss.detach() / micro)
    return torch.stack(losses).sum().item()


@validated
def zeroes_between(model, x, y, micro):
    losses = []
    for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
        model.zero_grad()
        loss = model(xb, yb) / micro
        loss.backward()
        losses.append(loss.detach())
    return torch.stack(losses).sum().item()


def scaled_by(factor):
    @validated
    def accumulate(model, x, y, micro):
        losses = []
        for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
            loss = model(xb, yb) / micro
            (loss * factor(micro)).backward()
            losses.append(loss.detach())
        return torch.stack(losses).sum().item()

    return accumulate


@validated
def all_forwards_first(model, x, y, micro):
    total = sum(model(xb, yb) / micro for xb, yb in zip(x.chunk(micro), y.chunk(micro)))
    total.backward()
    return total.item()


@validated
def item_per_chunk(model, x, y, micro):
    total = 0.0
    for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
        loss = model(xb, yb) / micro
        loss.backward()
        total += loss.item()
    return total


def accumulate_unchecked(model, x, y, micro):
    losses = []
    for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
        loss = model(xb, yb) / micro
        loss.backward()
        losses.append(loss.detach())
    return torch.stack(losses).sum()


returns_a_tensor = validated(accumulate_unchecked)


@validated
def returns_the_sum_of_means(model, x, y, micro):
    losses = []
    for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
        loss = model(xb, yb)
        (loss / micro).backward()
        losses.append(loss.detach())
    return torch.stack(losses).sum().item()


@validated
def whole_batch(model, x, y, micro):
    loss = model(x, y)
    loss.backward()
    return loss.item()


@validated
def steps(model, x, y, micro):
    loss = returns_a_tensor(model, x, y, micro)
    with torch.no_grad():
        for p in model.parameters():
            p -= 1e-3 * p.grad
    return loss.item()


def no_validation(model, x, y, micro):
    return accumulate_unchecked(model, x, y, max(micro, 1)).item()


def checks_after_running(model, x, y, micro):
    if micro < 1:
        raise ValueError("micro_batches must be >= 1")
    loss = accumulate_unchecked(model, x, y, micro).item()
    if len(x) % micro:
        raise ValueError("does not split")
    return loss


def divides_by_zero(model, x, y, micro):
    if len(x) % micro:
        raise ValueError("does not split")
    return accumulate_unchecked(model, x, y, micro).item()


@validated
def retains_the_graphs(model, x, y, micro):  # issue 24: right gradients, every chunk kept alive
    losses = []
    for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
        loss = model(xb, yb) / micro
        loss.backward(retain_graph=True)
        losses.append(loss)
    return torch.stack(losses).sum().item()


@validated
def retains_while_the_next_runs(model, x, y, micro):
    total = torch.zeros(())
    loss = None
    for xb, yb in zip(x.chunk(micro), y.chunk(micro)):
        loss = model(xb, yb) / micro  # the previous chunk's graph lives until this returns
        loss.backward(retain_graph=True)
        total += loss.detach()
    return total.item()


ACCUMULATION_MISTAKES = [
    (retains_the_graphs, "activations were still alive"),
    (retains_while_the_next_runs, "activations were still alive"),
    (undivided, "divide it by micro_batches"),
    (zeroes_between, "zeroed the gradients between micro-batches"),
    (all_forwards_first, "forwards before a backward"),
    (item_per_chunk, "host syncs"),
    (returns_a_tensor, "Python float"),
    (returns_the_sum_of_means, "sum of the chunk means"),
    (whole_batch, "equal chunks"),
    (steps, "no optimizer step"),
    (no_validation, "nothing was raised"),
    (checks_after_running, "before the first forward"),
    (divides_by_zero, "ZeroDivisionError"),
    (scaled_by(lambda micro: 1 / micro), "divided by micro_batches (2) twice"),
    (scaled_by(lambda micro: 0.9), "0.9x the whole batch's. Run forward and backward"),
]


@pytest.mark.parametrize(("wrong", "hint"), ACCUMULATION_MISTAKES)
def test_wrong_accumulations_fail_with_their_hint(wrong, hint: str) -> None:
    result = check_accumulate_micro_batches(wrong)
    assert fails(result, hint), result.message


def test_accumulation_other_correct_style_passes() -> None:
    def by_slices(model, x, y, micro_batches):
        if micro_batches < 1 or x.shape[0] % micro_batches != 0:
            raise ValueError(f"cannot split {x.shape[0]} into {micro_batches} equal parts")
        model.zero_grad(set_to_none=True)  # allowed: the gradients start at None or zero
        size = x.shape[0] // micro_batches
        total = torch.zeros((), device=x.device)
        for i in range(micro_batches):
            chunk = slice(i * size, (i + 1) * size)
            loss = model(x[chunk], targets=y[chunk]) / micro_batches
            loss.backward()
            total += loss.detach()
        return float(total)

    assert check_accumulate_micro_batches(by_slices).passed


# --- exercise 4: the largest batch that fits ----------------------------------------------------


def searcher(*, fit=lambda saved, budget: saved <= budget, measure=None, cfg_of=lambda c: c):
    """A largest_gpt_batch with one piece changed."""

    def largest_gpt_batch(cfg, budget_bytes):
        model = make_gpt(cfg_of(cfg), device="meta")

        def fits(batch):
            idx = torch.zeros(batch, cfg.seq_len, dtype=torch.long, device="meta")
            with ActivationMeter(model) as meter:
                model(idx, torch.zeros_like(idx)) if measure is None else measure(model, idx)
            return fit(meter.total_bytes, budget_bytes)

        return find_max_batch(fits).largest

    return largest_gpt_batch


def first_that_does_not_fit(cfg, budget_bytes):
    return searcher()(cfg, budget_bytes) + 1


def returns_zero(cfg, budget_bytes):
    try:
        return searcher()(cfg, budget_bytes)
    except ValueError:
        return 0


def counts_parameters(cfg, budget_bytes):
    model = make_gpt(cfg, device="meta")

    def fits(batch):
        idx = torch.zeros(batch, cfg.seq_len, dtype=torch.long, device="meta")
        with ActivationMeter() as meter:
            model(idx, torch.zeros_like(idx))
        return meter.total_bytes <= budget_bytes

    return find_max_batch(fits).largest


def one_by_one(cfg, budget_bytes):
    model = make_gpt(cfg, device="meta")
    batch = 0
    while True:
        idx = torch.zeros(batch + 1, cfg.seq_len, dtype=torch.long, device="meta")
        with ActivationMeter(model) as meter:
            model(idx, torch.zeros_like(idx))
        if meter.total_bytes > budget_bytes:
            if batch == 0:
                raise ValueError("batch 1 does not fit")
            return batch
        batch += 1


def on_the_cpu(cfg, budget_bytes):
    model = make_gpt(cfg)

    def fits(batch):
        idx = torch.zeros(batch, cfg.seq_len, dtype=torch.long)
        with ActivationMeter(model) as meter:
            model(idx, torch.zeros_like(idx))
        return meter.total_bytes <= budget_bytes

    return find_max_batch(fits).largest


def half_of_it(cfg, budget_bytes):
    return searcher()(cfg, budget_bytes) // 2


def other_error_when_nothing_fits(cfg, budget_bytes):
    try:
        return searcher()(cfg, budget_bytes)
    except ValueError:
        raise RuntimeError("no batch fits") from None


def keeps_trying_when_nothing_fits(cfg, budget_bytes):
    for _ in range(100):  # 100 forwards: more than the 64 the exercise allows
        try:
            return searcher()(cfg, budget_bytes)
        except ValueError:
            continue
    raise ValueError("no batch fits")


ignores_checkpointing = searcher(cfg_of=lambda cfg: replace(cfg, checkpoint=False))

BUDGET_MISTAKES = [
    (first_that_does_not_fit, "does NOT fit"),
    (searcher(fit=lambda saved, budget: saved < budget), "one too small"),
    (ignores_checkpointing, "checkpoint=True"),
    (searcher(measure=lambda model, idx: model(idx)), "without targets"),
    (counts_parameters, "ActivationMeter(model)"),
    (returns_zero, "raise ValueError"),
    (one_by_one, "forwards"),
    (on_the_cpu, "meta device"),
    (lambda cfg, budget: float(searcher()(cfg, budget)), "as an integer"),
    (half_of_it, "measure one forward of make_gpt(cfg, device='meta')"),
    (other_error_when_nothing_fits, "raised RuntimeError; raise ValueError"),
    (keeps_trying_when_nothing_fits, "below batch 1's] you ran more than 64 forwards"),
    # issue 24: the tokens passed as their own targets count one tensor too few
    (searcher(measure=lambda model, idx: model(idx, idx)), "tokens as their own targets"),
]


@pytest.mark.parametrize(("wrong", "hint"), BUDGET_MISTAKES)
def test_wrong_largest_batches_fail_with_their_hint(wrong, hint: str) -> None:
    result = check_largest_gpt_batch(wrong)
    assert fails(result, hint), result.message


def on_the_cpu_by_name(cfg, budget_bytes):
    model = make_gpt(cfg)  # the model on the CPU too

    def fits(batch):
        idx = torch.zeros(batch, cfg.seq_len, dtype=torch.long)
        with ActivationMeter(model) as meter:
            model(idx=idx, targets=torch.zeros_like(idx))
        return meter.total_bytes <= budget_bytes

    return find_max_batch(fits).largest


def test_tokens_by_name_on_the_cpu_fail_on_the_device_contract() -> None:
    result = check_largest_gpt_batch(on_the_cpu_by_name)
    assert fails(result, "your forwards ran on ['cpu']"), result.message


def bisects_a_fixed_range(cfg, budget_bytes):
    """Correct and O(log n) in the range: 1 + 20 forwards whatever the answer (issue 24)."""
    model = make_gpt(cfg, device="meta")

    def fits(batch):
        idx = torch.zeros(batch, cfg.seq_len, dtype=torch.long, device="meta")
        with ActivationMeter(model) as meter:
            model(idx, torch.zeros_like(idx))
        return meter.total_bytes <= budget_bytes

    if not fits(1):
        raise ValueError("not even batch 1 fits")
    low, high = 1, 2**20
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


@pytest.mark.parametrize(
    "right",
    [bisects_a_fixed_range, lambda cfg, budget: np.int64(searcher()(cfg, budget))],
    ids=["bisects a fixed range", "returns a numpy integer"],
)
def test_correct_answers_the_old_checker_refused_pass(right) -> None:  # noqa: ANN001
    result = check_largest_gpt_batch(right)
    assert result.passed, result.message


def test_the_reference_search_says_zero_when_nothing_fits() -> None:
    from helpers.checks import ch07

    assert ch07._largest_by(ch07._BUDGET_CONFIGS[0], budget=1, way="with parameters") == 0


def test_largest_batch_other_correct_style_passes() -> None:
    def doubling_and_bisection(cfg, budget_bytes):
        model = make_gpt(cfg, device="meta")

        def saved(batch):
            idx = torch.zeros(batch, cfg.seq_len, dtype=torch.long, device="meta")
            with ActivationMeter(model) as meter:
                model(idx, torch.zeros_like(idx))
            return meter.total_bytes

        if saved(1) > budget_bytes:
            raise ValueError("not even batch 1 fits")
        good, bad = 1, 2
        while saved(bad) <= budget_bytes:
            good, bad = bad, 2 * bad
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if saved(mid) <= budget_bytes else (good, mid)
        return good

    assert check_largest_gpt_batch(doubling_and_bisection).passed


# --- an older torch: the meta-device probes step aside where the meta device cannot run them ---


def test_without_meta_attention_the_meta_probe_is_skipped(solutions, monkeypatch) -> None:
    from helpers.checks import ch07

    def no_meta(q, k, v):
        raise NotImplementedError("no meta kernel")

    monkeypatch.setattr(ch07, "manual_attention", no_meta)
    ch07._meta_attention_runs.cache_clear()
    try:
        assert not ch07._meta_attention_runs()
        assert check_causal_attention(mask_on_the_cpu).passed  # it fails only on meta
        assert check_causal_attention(solutions["causal_attention"]).passed
    finally:
        monkeypatch.undo()
        ch07._meta_attention_runs.cache_clear()


def test_without_meta_checkpointing_those_budgets_are_skipped(solutions, monkeypatch) -> None:
    from helpers.checks import ch07

    measure = ch07._saved_bytes

    def old_torch(cfg, batch, way="right"):
        if cfg.checkpoint:
            raise AttributeError("module 'torch' has no attribute 'meta'")
        return measure(cfg, batch, way)

    monkeypatch.setattr(ch07, "_saved_bytes", old_torch)
    ch07._meta_checkpoint_runs.cache_clear()
    try:
        assert not ch07._meta_checkpoint_runs()
        assert check_largest_gpt_batch(ignores_checkpointing).passed
        assert check_largest_gpt_batch(solutions["largest_gpt_batch"]).passed
    finally:
        monkeypatch.undo()
        ch07._meta_checkpoint_runs.cache_clear()
