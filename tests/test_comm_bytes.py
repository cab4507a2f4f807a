"""Chapter 4, erratum 4: optimizer-state bytes and the bytes DDP hands to all-reduce.

In-process, without torchrun: a one-rank gloo group (the world size tools/gpu_check.py uses
with NCCL) is enough for DDP to call its communication hook on every bucket.
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.models import make_mlp
from helpers.scripts import fsdp_vs_ddp as f


def step_bytes(hook: str) -> tuple[int, list[torch.Tensor]]:
    """Bytes handed to all-reduce in one DDP step of a small MLP, and its gradients."""
    net = DDP(make_mlp((64, 64, 64, 1), seed=0))
    counter = {"hook": hook, "bytes": 0}
    net.register_comm_hook(state=counter, hook=f.counting_hook)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    net(x).sum().backward()
    return counter["bytes"], [p.grad for p in net.parameters()]


def test_counting_hook_counts_every_gradient_once(one_rank_group: None) -> None:
    n = sum(p.numel() for p in make_mlp((64, 64, 64, 1)).parameters())
    plain, grads = step_bytes("none")
    assert plain == 4 * n
    for hook, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        sent, compressed = step_bytes(hook)
        assert 2 * sent == plain
        assert all(torch.equal(g, g.to(dtype).float()) for g in compressed)
        assert all(torch.allclose(g, r, rtol=1e-2, atol=1e-3) for g, r in zip(compressed, grads))


def test_state_bytes_of_adam_and_sgd() -> None:
    model = make_mlp((64, 64, 1))
    n = sum(p.numel() for p in model.parameters())
    adam, sgd = torch.optim.Adam(model.parameters()), torch.optim.SGD(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    adam.step()
    sgd.step()
    assert f.state_bytes(sgd) == 0
    steps = 4 * len(list(model.parameters()))  # Adam keeps its step count as a float32 tensor
    assert f.state_bytes(adam) in (8 * n, 8 * n + steps)


def test_tensor_bytes_looks_inside_subclasses() -> None:
    class Packed(torch.Tensor):
        """A tensor subclass that holds its data in two inner tensors, like torchao's state."""

        def __tensor_flatten__(self):  # noqa: ANN204
            return ["codes", "scale"], None

    outer = torch.Tensor._make_subclass(Packed, torch.empty(0))
    outer.codes = torch.zeros(1000, dtype=torch.uint8)
    outer.scale = torch.zeros(4)
    assert f.tensor_bytes(outer) == 1000 + 16
    assert f.tensor_bytes(torch.zeros(3, dtype=torch.float64)) == 24


def test_computed_8bit_layout() -> None:
    big, small = torch.empty(512, 512), torch.empty(512)
    n = big.numel()
    assert f.computed_8bit_bytes([big]) == 2 * (n + 4 * n // 256 + 4 * 256)
    assert f.computed_8bit_bytes([small]) == 8 * 512  # under 4096 values: two fp32 states
    assert f.computed_8bit_bytes([torch.empty(4097)]) == 2 * (4097 + 4 * 17 + 4 * 256)


def test_no_8bit_library_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # None: import raises ImportError
    monkeypatch.setitem(sys.modules, "torchao", None)
    opt, why = f.eight_bit_adam([torch.nn.Parameter(torch.zeros(3))], lr=1e-3)
    assert opt is None and "bitsandbytes" in why and "torchao" in why


def test_make_optimizer_names() -> None:
    params = [torch.nn.Parameter(torch.zeros(3))]
    assert isinstance(f.make_optimizer("Adam", params, 1e-3)[0], torch.optim.Adam)
    assert isinstance(f.make_optimizer("SGD", params, 1e-3)[0], torch.optim.SGD)
    assert f.make_optimizer("SGD", params, 1e-3)[1].startswith("torch ")
