"""Chapter 7's two exactness checks catch the mistakes they are there for (run on the notebook's cells)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from notebook_code import cell_containing

from helpers.gpt import GPTConfig, make_gpt, manual_attention

NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "07_capstone.ipynb"
ACCUMULATION = "tiny = make_gpt(capstone_sizes"
SDPA = "bound = rounding_bound(q, k, v"


def accumulation_namespace() -> dict:
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=64, seq_len=256)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (4, cfg.seq_len + 1), generator=g)
    return {
        "torch": torch,
        "make_gpt": make_gpt,
        "capstone_sizes": lambda device: (cfg, 4),
        "SEED": 0,
        "big_x": tokens[:, :-1],
        "big_y": tokens[:, 1:],
    }


def test_the_float64_accumulation_check_passes_on_the_same_math() -> None:
    exec(cell_containing(NOTEBOOK, ACCUMULATION), accumulation_namespace())


def test_the_float64_accumulation_check_fails_without_dividing_the_loss() -> None:
    cell = cell_containing(NOTEBOOK, ACCUMULATION)
    assert "(tiny(mx, my) / 2).backward()" in cell
    with pytest.raises(AssertionError):
        exec(cell.replace("(tiny(mx, my) / 2)", "tiny(mx, my)"), accumulation_namespace())


def sdpa_namespace(attention) -> dict:  # noqa: ANN001
    return {
        "torch": torch,
        "F": F,
        "cfg": GPTConfig(n_layer=2, n_head=4, d_model=64, seq_len=256),
        "device": torch.device("cpu"),
        "manual_attention": attention,
    }


def test_the_sdpa_check_passes_for_the_written_out_attention() -> None:
    exec(cell_containing(NOTEBOOK, SDPA), sdpa_namespace(manual_attention))


@pytest.mark.parametrize(
    "wrong",
    [
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=False),  # mask lost
        lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=0.99 / q.size(-1) ** 0.5
        ),
    ],
    ids=["not causal", "scale 1% off"],
)
def test_the_sdpa_check_fails_for_other_math(wrong) -> None:  # noqa: ANN001
    with pytest.raises(AssertionError, match="differ by"):
        exec(cell_containing(NOTEBOOK, SDPA), sdpa_namespace(wrong))
