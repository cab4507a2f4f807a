"""Lines of the exercise checkers (helpers/checks/) no other unit test ran (tests/gpu_only_lines.md).

The device branches run through the fake_gpu fixture or a patched pick_device; chapter 4's
launch is faked by patching helpers.launch.launch / read_results (no torchrun here).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.functional import relu

from helpers.checks import CheckFailed, NotDoneYet, ch01, ch02, ch03, ch04
from helpers.checks.ch06 import check_step_mfu
from helpers.launch import LaunchResult

# --------------------------------------------------------------------------- chapter 1


def test_same_wants_a_torch_device() -> None:
    assert ch01._same(torch.device("cuda", 1), "cuda:1")
    assert ch01._same(torch.device("cuda", 0), "cuda")  # no index wanted: any
    assert not ch01._same(torch.device("cuda", 0), "cuda:1")
    assert not ch01._same("cuda:1", "cuda:1"), "a string is not a torch.device"


def _evaluate_reads_numbers(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor):  # noqa: ANN202
    """Right: data moved to the model's device, numbers read at the end (fails on meta there)."""
    device = next(model.parameters()).device
    logits = model(inputs.to(device))
    loss = nn.functional.cross_entropy(logits, labels.to(device))
    return loss.item(), logits.softmax(-1).cpu().numpy()


def _evaluate_moves_the_model(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor):  # noqa: ANN202
    model.to("cpu")
    return _evaluate_reads_numbers(model, inputs, labels)


def _evaluate_on_the_cpu(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor):  # noqa: ANN202
    logits = model(inputs.to("cpu"))
    return nn.functional.cross_entropy(logits, labels).item(), logits.detach().numpy()


def test_evaluate_on_meta_accepts_a_right_answer() -> None:
    ch01._evaluate_on_meta(_evaluate_reads_numbers)


def test_evaluate_on_meta_passes_a_stub_and_a_plain_bug_through() -> None:
    def stub(model, inputs, labels):  # noqa: ANN001, ANN202
        raise NotImplementedError("your code here")

    def bug(model, inputs, labels):  # noqa: ANN001, ANN202
        raise KeyError("labels")

    with pytest.raises(NotImplementedError, match="your code here"):
        ch01._evaluate_on_meta(stub)
    with pytest.raises(KeyError, match="labels"):
        ch01._evaluate_on_meta(bug)


def test_evaluate_on_meta_a_result_that_never_left_the_device() -> None:
    def no_numbers(model, inputs, labels):  # noqa: ANN001, ANN202
        logits = model(inputs.to(next(model.parameters()).device))
        return logits.sum(), logits

    with pytest.raises(CheckFailed, match="never left the model's device"):
        ch01._evaluate_on_meta(no_numbers)


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (_evaluate_moves_the_model, "Do not move the model"),
        (_evaluate_on_the_cpu, "next(model.parameters()).device"),
    ],
)
def test_evaluate_on_meta_names_the_fix(fn, hint: str) -> None:  # noqa: ANN001
    with pytest.raises((CheckFailed, RuntimeError, NotImplementedError)) as info:
        ch01._evaluate_on_meta(fn)
    if isinstance(info.value, CheckFailed):
        assert hint in str(info.value)


def test_pick_device_checker_a_picker_that_ignores_prefer(capsys) -> None:  # noqa: ANN001
    def ignores_prefer(prefer: str | None = None) -> torch.device:
        return torch.device("cpu")

    assert not ch01.check_pick_device(ignores_prefer)
    assert "expected device(type='meta'), got device(type='cpu'): use `prefer`." in (
        capsys.readouterr().out
    )


# --------------------------------------------------------------------------- chapter 2


class _OnGpu:
    """CPU losses that say they live on a GPU: what train_steps returns there, without kernels."""

    device = torch.device("cuda", 0)

    def __init__(self, losses: torch.Tensor) -> None:
        self.losses = losses

    def detach(self) -> _OnGpu:
        return self

    def cpu(self) -> torch.Tensor:
        return self.losses


def _train_steps(model, x, y, device, steps: int = 5, lr: float = 0.1):  # noqa: ANN001, ANN202
    """The exercise's answer, run on the CPU when asked for the (fake) GPU."""
    on_gpu = torch.device(device).type == "cuda"
    device = "cpu" if on_gpu else device
    model, x, y = model.to(device), x.to(device), y.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = torch.zeros(steps, device=device)
    for i in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses[i] = loss.detach()
    return _OnGpu(losses * (2 if lr == 0.2 else 1)) if on_gpu else losses


def test_train_steps_checker_compares_the_gpus_losses_with_the_cpus(monkeypatch, capsys) -> None:  # noqa: ANN001
    monkeypatch.setattr(ch02, "pick_device", lambda *a, **k: torch.device("cuda", 0))
    assert ch02.check_train_steps(_train_steps)

    def wrong_on_gpu(model, x, y, device, steps: int = 5):  # noqa: ANN001, ANN202
        return _train_steps(model, x, y, device, steps, lr=0.2 if str(device) == "cuda:0" else 0.1)

    assert not ch02.check_train_steps(wrong_on_gpu)
    assert "on cuda:0 the losses differ from the CPU's" in capsys.readouterr().out


# --------------------------------------------------------------------------- chapter 3


def test_grad_norm_without_gradients_is_zero() -> None:
    layer = nn.Linear(2, 2)
    assert ch03._grad_norm(list(layer.parameters())) == 0.0
    layer(torch.ones(1, 2)).sum().backward()
    assert ch03._grad_norm(list(layer.parameters())) > 0


def test_fp16_fate_checker_samples_beyond_its_named_probes(capsys) -> None:  # noqa: ANN001
    named = {value for value, _ in ch03._FATE_PROBES}
    odd = next(v for v in ch03._sampled_values() if v not in named and ch03._cast_fate(v) != "inf")

    def almost(x: float) -> str:
        return "inf" if x == odd else ch03._cast_fate(x)

    assert ch03.check_fp16_fate(ch03._cast_fate)
    capsys.readouterr()
    assert not ch03.check_fp16_fate(almost)
    out = capsys.readouterr().out
    assert f"fp16_fate({odd!r}) = 'inf', a cast gives" in out and "rounding boundaries" in out


# --------------------------------------------------------------------------- chapter 4

SCALE = 2.0


def _average(model: nn.Module) -> None:
    """A self-contained exercise answer: a module, a simple value and an importable name."""
    for p in model.parameters():
        p.grad = relu(p.grad) * SCALE + math.pi * 0


def _stub(model: nn.Module) -> None:
    raise NotImplementedError


def test_names_looks_inside_nested_code() -> None:
    def outer() -> object:
        return lambda: torch.zeros(1) + SCALE

    assert {"torch", "zeros", "SCALE"} <= ch04._names(outer.__code__)


class _Shadow:
    pass


def test_importable_only_what_imports_back_as_itself() -> None:
    assert ch04._importable(nn.Linear) == ("torch.nn.modules.linear", "Linear")
    assert ch04._importable(test_names_looks_inside_nested_code) is not None

    def local() -> None:
        pass

    assert ch04._importable(local) is None, "<locals> cannot be imported"
    assert ch04._importable(42) is None, "no module, no name"
    lost = type("Lost", (), {"__module__": "no_such_module_anywhere"})
    assert ch04._importable(lost) is None
    renamed = type("Gone", (), {"__module__": __name__})
    assert ch04._importable(renamed) is None, "no such name in that module"
    impostor = type("_Shadow", (), {"__module__": __name__})
    assert ch04._importable(impostor) is None, "that name is another object"


def test_payload_carries_modules_values_and_importable_names() -> None:
    data = ch04.payload(_average)
    assert data["name"] == "_average"
    assert data["modules"] == {"math": "math"}  # annotations are strings: nn is not used
    assert data["values"] == {"SCALE": 2.0}
    assert data["objects"] == {"relu": ("torch.nn.functional", "relu")}


def test_payload_errors_name_the_fix() -> None:
    with pytest.raises(CheckFailed, match="pass your function itself, not int"):
        ch04.payload(3)

    def make() -> object:
        x = 1

        def inner() -> int:
            return x

        return inner

    with pytest.raises(CheckFailed, match="at the top level of the cell"):
        ch04.payload(make())
    uses_a_notebook_object = _average.__globals__.copy()
    uses_a_notebook_object["SCALE"] = object()
    fn = type(_average)(_average.__code__, uses_a_notebook_object, "_average")
    with pytest.raises(
        CheckFailed, match="uses 'SCALE' from the notebook.*inside the exercise cell"
    ):
        ch04.payload(fn)


def test_run_in_process_leaves_an_existing_group_alone(monkeypatch) -> None:  # noqa: ANN001
    with pytest.raises(NotDoneYet):
        ch04.run_in_process(_stub, "average_gradients")
    monkeypatch.setattr(ch04.dist, "is_initialized", lambda: True)
    assert ch04.run_in_process(_average, "average_gradients") == {}


def test_run_in_process_a_wait_for_a_missing_rank_names_collectives(monkeypatch) -> None:  # noqa: ANN001
    def waits(*args: object) -> dict:
        raise RuntimeError("dist.recv at world size 1: there is no other rank to receive from")

    monkeypatch.setattr(ch04.task, "run_task", waits)
    with pytest.raises(CheckFailed, match="use collectives such as dist.all_reduce"):
        ch04.run_in_process(_average, "average_gradients")

    def wrong(*args: object) -> dict:
        raise ValueError("a plain bug")

    monkeypatch.setattr(ch04.task, "run_task", wrong)
    with pytest.raises(CheckFailed, match="a plain bug") as info:
        ch04.run_in_process(_average, "average_gradients")
    assert "all_reduce" not in str(info.value)


@pytest.fixture
def fake_launch(monkeypatch, tmp_path):  # noqa: ANN001, ANN201
    """Patch launch/read_results; returns a dict the test fills: 'result', 'ranks'."""
    state: dict = {"calls": []}

    def launch(script, nproc, args, **kw):  # noqa: ANN001, ANN003, ANN202
        state["calls"].append((script, nproc, kw))
        state["payload written"] = (tmp_path / "run" / "payload.pkl").is_file()
        return state["result"]

    def new_run_dir(name: str) -> Path:
        (tmp_path / "run").mkdir(exist_ok=True)
        return tmp_path / "run"

    monkeypatch.setattr(ch04, "launch", launch)
    monkeypatch.setattr(ch04, "new_run_dir", new_run_dir)
    monkeypatch.setattr(ch04, "read_results", lambda out, world: state["ranks"])
    return state


def _launched(ok: bool = True) -> LaunchResult:
    lines = [f"line {i}" for i in range(20)]
    return LaunchResult(
        ["torchrun"], 3, "gloo", returncode=0 if ok else 1, lines=lines, message="rank 1 died"
    )


def test_run_on_ranks_returns_every_ranks_result(fake_launch, tmp_path) -> None:  # noqa: ANN001
    fake_launch["result"] = _launched()
    fake_launch["ranks"] = [{"status": "ok", "rank": r} for r in range(3)]
    assert ch04.run_on_ranks(_average, "average_gradients", 3) == fake_launch["ranks"]
    script, nproc, kw = fake_launch["calls"][0]
    assert (script, nproc, kw["tiny_job"], kw["check"]) == ("exercise_check", 3, True, False)
    assert fake_launch["payload written"], "the ranks read the function from payload.pkl"
    assert not (tmp_path / "run").exists(), "the run's folder is removed once read"


def test_run_on_ranks_failures(fake_launch) -> None:  # noqa: ANN001
    with pytest.raises(NotDoneYet):
        ch04.run_on_ranks(_stub, "average_gradients", 3)
    assert not fake_launch["calls"], "a stub is recognised without launching"
    fake_launch["result"] = _launched(ok=False)
    with pytest.raises(CheckFailed, match="the 3-rank run failed. rank 1 died") as info:
        ch04.run_on_ranks(_average, "average_gradients", 3)
    assert "line 19" in str(info.value) and "line 4\n" not in str(info.value), "the last 15 lines"
    fake_launch["result"] = _launched()
    fake_launch["ranks"] = [{"status": "ok"}, {"status": "todo"}, {"status": "ok"}]
    with pytest.raises(NotDoneYet):
        ch04.run_on_ranks(_average, "average_gradients", 3)
    fake_launch["ranks"] = [{"status": "ok"}, {"status": "error", "error": "KeyError: 'w'"}]
    with pytest.raises(
        CheckFailed, match=r"\[probe: 3 ranks\] your function raised on the ranks: KeyError"
    ):
        ch04.run_on_ranks(_average, "average_gradients", 3)


# --------------------------------------------------------------------------- chapter 6


def test_step_mfu_checker_wants_value_errors(capsys) -> None:  # noqa: ANN001
    from torch.utils.flop_counter import FlopCounterMode

    def mfu_without_checks(step, seconds: float, peak: float) -> float:  # noqa: ANN001
        with FlopCounterMode(display=False) as counter:
            step()
        return counter.get_total_flops() / (abs(seconds) or 1.0) / (peak or 1.0)

    def mfu_checks_seconds_only(step, seconds: float, peak: float) -> float:  # noqa: ANN001
        if seconds <= 0:
            raise ValueError("seconds")
        return mfu_without_checks(step, seconds, peak) if peak else 0.0

    def right(step, seconds: float, peak: float) -> float:  # noqa: ANN001
        if seconds <= 0 or peak <= 0:
            raise ValueError("seconds and peak must be > 0")
        return mfu_without_checks(step, seconds, peak)

    assert check_step_mfu(right)
    capsys.readouterr()
    assert not check_step_mfu(mfu_without_checks)
    assert "seconds=0.0 must raise ValueError" in capsys.readouterr().out
    assert not check_step_mfu(mfu_checks_seconds_only)
    assert "peak=0 must raise ValueError" in capsys.readouterr().out


def test_distinguishing_profile_profiles_again_until_the_need_holds() -> None:
    from helpers.checks import ch06

    calls, asked = [], []

    def need(prof) -> bool:  # noqa: ANN001 - a torch.profiler.profile
        asked.append(len(prof.key_averages()))
        return len(asked) >= 2  # the first profile is "not distinguishing", the second is

    prof = ch06._distinguishing_profile(lambda: calls.append(torch.ones(4).sum()), need, tries=3)
    assert len(asked) == 2 and len(calls) == 4 and prof.key_averages()  # warm-up + profiled, twice
