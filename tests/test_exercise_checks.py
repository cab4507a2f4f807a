"""Every chapter's exercise checkers: each passes its solution and calls the untouched stub 'todo'.

The typical wrong answers each checker must fail live in tests/test_exercises_chNN.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import psutil
import pytest

from helpers.checks import PASS, TODO, ch01, ch02, ch03, ch04, ch05, ch06, ch07, ch08, ch08_parallel

from nbfiles import exercise_namespace

#: chapter -> [(checker, the names of the notebook functions it is given)]
CHAPTERS: dict[str, list[tuple[Callable, tuple[str, ...]]]] = {
    "01_devices": [
        (ch01.check_pick_device, ("my_pick_device",)),
        (ch01.check_fresh_copy, ("fresh_copy",)),
        (ch01.check_evaluate, ("evaluate",)),
        (ch01.check_achieved_gflops, ("achieved_gflops",)),
        (ch01.check_to_numpy, ("to_numpy",)),
    ],
    "02_training_loop": [
        (ch02.check_train_steps, ("train_steps",)),
        (ch02.check_train_epoch, ("train_epoch",)),
        (ch02.check_resident_batches, ("resident_batches",)),
        (ch02.check_fastest_batch_size, ("fastest_batch_size",)),
    ],
    "03_mixed_precision": [
        (ch03.check_fp16_fate, ("fp16_fate",)),
        (ch03.check_pick_amp_dtype, ("pick_amp_dtype",)),
        (ch03.check_amp_train_step, ("amp_train_step",)),
        (ch03.check_scaler_checkpoint, ("save_checkpoint", "load_checkpoint")),
    ],
    "04_multi_gpu": [
        (ch04.check_scaled_lr, ("scaled_lr",)),
        (ch04.check_average_gradients, ("average_gradients",)),
        (ch04.check_accumulate, ("accumulate",)),
        (ch04.check_train_ddp, ("train_ddp",)),
    ],
    "05_memory": [
        (ch05.check_training_bill, ("training_bill",)),
        (ch05.check_accumulate_gradients, ("accumulate_gradients",)),
        (ch05.check_forward_low_memory, ("forward_low_memory",)),
        (ch05.check_largest_batch, ("largest_batch",)),
        (ch05.check_safe_step, ("safe_step",)),
    ],
    "06_profiling": [
        (ch06.check_measure, ("measure",)),
        (ch06.check_top_self_op, ("top_self_op",)),
        (ch06.check_fast_train, ("fast_train",)),
        (ch06.check_step_mfu, ("step_mfu",)),
    ],
    "07_capstone": [
        (ch07.check_causal_attention, ("causal_attention",)),
        (ch07.check_flops_per_token, ("flops_per_token",)),
        (ch07.check_accumulate_micro_batches, ("accumulate_micro_batches",)),
        (ch07.check_largest_gpt_batch, ("largest_gpt_batch",)),
    ],
    "08_build_it": [
        (ch08.check_merge_states, ("merge_states",)),
        (ch08.check_tiled_attention, ("tiled_attention",)),
        (ch08.check_triton_backward, ("triton_flash_backward",)),
        (ch08_parallel.check_overlap_hooks, ("overlap_hooks",)),
        (ch08_parallel.check_zero1_step, ("zero1_step",)),
    ],
}
CASES = [(chapter, check, names) for chapter, cases in CHAPTERS.items() for check, names in cases]
IDS = [f"{chapter[:2]}-{names[0]}" for chapter, _, names in CASES]


@functools.cache
def namespace(kind: str, chapter: str) -> dict:
    """The solutions ('solutions') or untouched stubs ('exercises') of one chapter."""
    return exercise_namespace(f"{kind}/{chapter}_{kind}.ipynb")


@pytest.mark.parametrize(("chapter", "check", "names"), CASES, ids=IDS)
def test_solution_passes(chapter: str, check, names: tuple[str, ...], capsys) -> None:
    ns = namespace("solutions", chapter)
    result = check(*(ns[n] for n in names))
    if result.status == ch08.SKIP:  # a check that cannot run here (Triton missing) says why
        pytest.skip(result.message)
    assert result.status == PASS
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize(("chapter", "check", "names"), CASES, ids=IDS)
def test_untouched_stub_is_todo(chapter: str, check, names: tuple[str, ...], capsys) -> None:
    ns = namespace("exercises", chapter)
    before = set(psutil.Process().children(recursive=True))
    result = check(*(ns[n] for n in names))
    if result.status == ch08.SKIP:
        pytest.skip(result.message)
    assert result.status == TODO
    assert "not done yet" in capsys.readouterr().out
    assert set(psutil.Process().children(recursive=True)) <= before, "a stub launched nothing"


def test_every_checker_is_covered() -> None:
    modules = {"01": ch01, "02": ch02, "03": ch03, "04": ch04, "05": ch05, "06": ch06, "07": ch07, "08": ch08}  # fmt: skip
    extra = {"08": [ch08_parallel]}  # chapter 8's data-parallel exercises have their own module
    for chapter, cases in CHAPTERS.items():
        found = [modules[chapter[:2]], *extra.get(chapter[:2], [])]
        public = {n for module in found for n in dir(module) if n.startswith("check_")}
        assert public == {check.__name__ for check, _ in cases}, chapter
