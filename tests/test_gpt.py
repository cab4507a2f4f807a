"""helpers.gpt: the capstone's GPT (chapter 7), on tiny configs that run in milliseconds."""

from __future__ import annotations

from dataclasses import replace
from pydoc_data.topics import topics

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from helpers.gpt import (
    GPTConfig,
    decay_groups,
    flops_per_token,
    make_gpt,
    manual_attention,
    non_embedding_params,
    text_bytes,
)

TINY = GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=8)
TWO = GPTConfig(n_layer=2, n_head=2, d_model=16, seq_len=8)


def batch(cfg: GPTConfig, b: int = 3, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A random (inputs, targets) pair of byte tokens for `cfg`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.vocab_size, (b, cfg.seq_len + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def loss_and_grads(cfg: GPTConfig, seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward + backward of make_gpt(cfg, seed): the loss and every parameter's gradient."""
    model = make_gpt(cfg, seed=seed)
    loss = model(*batch(cfg))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


# --------------------------------------------------------------------------- GPTConfig


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_layer": 0}, "n_layer"),
        ({"n_head": -1}, "n_head"),
        ({"d_model": 2.5}, "d_model"),
        ({"seq_len": True}, "seq_len"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"d_model": 10, "n_head": 4}, r"d_model \(10\) must be a multiple of n_head \(4\)"),
        ({"attention": "flash"}, r"attention must be one of \('manual', 'sdpa'\), got 'flash'"),
    ],
)
def test_config_validation_names_the_bad_field(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replace(TINY, **changes)


def test_defaults_are_a_valid_small_model() -> None:
    cfg = GPTConfig()
    assert (cfg.n_layer, cfg.d_model, cfg.vocab_size, cfg.attention) == (2, 128, 256, "manual")
    assert cfg.checkpoint is False


# --------------------------------------------------------------------------- the model


def test_same_seed_same_weights_whatever_the_levers() -> None:
    reference = make_gpt(TWO, seed=3).state_dict()
    for attention in ("manual", "sdpa"):
        for ckpt in (False, True):
            other = make_gpt(replace(TWO, attention=attention, checkpoint=ckpt), seed=3)
            for name, tensor in other.state_dict().items():
                assert torch.equal(tensor, reference[name]), name
    different = make_gpt(TWO, seed=4).state_dict()
    assert not torch.equal(different["wte.weight"], reference["wte.weight"])


def test_make_gpt_leaves_the_global_generator_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_gpt(TINY, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_init_small_normal_weights_and_zero_biases() -> None:
    model = make_gpt(TINY)
    assert model.blocks[0].attn.qkv.bias.abs().sum() == 0
    assert 0.01 < model.wte.weight.std().item() < 0.03
    assert torch.equal(model.ln_f.weight, torch.ones(TINY.d_model))


def test_logits_without_targets_and_a_loss_with_them() -> None:
    model = make_gpt(TINY)
    x, y = batch(TINY, b=2)
    logits = model(x)
    assert logits.shape == (2, TINY.seq_len, TINY.vocab_size)
    loss = model(x, y)
    assert loss.ndim == 0 and loss.dtype == torch.float32
    expected = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    torch.testing.assert_close(loss, expected)
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.1  # near-uniform at init


def test_manual_attention_is_causal_sdpa() -> None:
    q, k, v = torch.randn(3, 2, 2, 5, 4).unbind(0)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(manual_attention(q, k, v), expected, rtol=1e-5, atol=1e-6)
    changed = v.clone()
    changed[..., -1, :] += 1  # the last token's value: no earlier position may see it
    out = manual_attention(q, k, changed)
    torch.testing.assert_close(out[..., :-1, :], expected[..., :-1, :], rtol=1e-5, atol=1e-6)


def test_manual_and_sdpa_attention_give_the_same_outputs() -> None:
    x, y = batch(TWO)
    manual = make_gpt(TWO)
    sdpa = make_gpt(replace(TWO, attention="sdpa"))
    torch.testing.assert_close(sdpa(x), manual(x), rtol=1e-5, atol=1e-5)
    (loss_m, grads_m), (loss_s, grads_s) = (
        loss_and_grads(TWO),
        loss_and_grads(replace(TWO, attention="sdpa")),
    )
    torch.testing.assert_close(loss_s, loss_m, rtol=1e-5, atol=1e-6)
    for name, grad in grads_m.items():
        torch.testing.assert_close(grads_s[name], grad, rtol=1e-4, atol=1e-6)


def test_checkpointing_gives_the_same_loss_and_gradients() -> None:
    loss, grads = loss_and_grads(TWO)
    loss_c, grads_c = loss_and_grads(replace(TWO, checkpoint=True))
    assert torch.equal(loss_c, loss)
    assert grads_c.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grads_c[name], grad, rtol=0, atol=0)


# --------------------------------------------------------------------------- counting


def test_the_tied_head_is_counted_once() -> None:
    model = make_gpt(TWO)
    assert model.head.weight is model.wte.weight
    d, v, n = TWO.d_model, TWO.vocab_size, TWO.n_layer
    per_block = 12 * d * d + 13 * d  # qkv, proj, two MLP linears (weights + biases), two norms
    assert non_embedding_params(model) == v * d + n * per_block + 2 * d
    every = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    assert every - non_embedding_params(model) == v * d + TWO.seq_len * d  # head twice, wpe


@pytest.mark.parametrize("cfg", [TINY, GPTConfig(n_layer=2, n_head=4, d_model=32, seq_len=32)])
def test_flops_per_token_within_10_percent_of_the_counted_flops(cfg: GPTConfig) -> None:
    model = make_gpt(cfg)
    x, y = batch(cfg, b=2)
    with FlopCounterMode(display=False) as counter:
        model(x, y).backward()
    counted = counter.get_total_flops() / x.numel()
    assert flops_per_token(model) == pytest.approx(counted, rel=0.10)
    n, t, d = cfg.n_layer, cfg.seq_len, cfg.d_model
    assert flops_per_token(model) == 6 * non_embedding_params(model) + 12 * n * t * d


def test_decay_groups_as_gpt2_is_trained() -> None:
    """Weight decay on matrices and embeddings (the tied head counted once), none on 1-D tensors."""
    model = make_gpt(TWO)
    decay, rest = decay_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}  # the tied weight is listed once
    assert sorted(names[id(p)] for p in decay["params"])[:2] == [
        "blocks.0.attn.proj.weight",
        "blocks.0.attn.qkv.weight",
    ]
    assert "wte.weight" in {names[id(p)] for p in decay["params"]}
    assert all(p.dim() == 1 for p in rest["params"])
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))


# --------------------------------------------------------------------------- the text


def test_text_bytes_is_the_pydoc_help_text() -> None:
    tokens = text_bytes()
    assert tokens.dtype == torch.int64 and tokens.ndim == 1
    assert 0 <= tokens.min().item() and tokens.max().item() < 256
    text = bytes(tokens.to(torch.uint8).tolist()).decode("utf-8")
    assert text == "\n\n".join(topics[key] for key in sorted(topics))
    assert len(tokens) > 100_000
    assert torch.equal(text_bytes(), tokens)  # the same every call
