"""The capstone's levers: the GPT trained with each on or off, measured into one table (chapter 7)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader, Dataset

from helpers.activations import ActivationMeter, autocast_context
from helpers.amp_choice import amp_for_device
from helpers.devices import describe_device, resolve_device, synchronize
from helpers.gpt import GPTConfig, make_gpt
from helpers.loops import best_adam_impl
from helpers.matmul import tf32_available, tf32_matmuls
from helpers.memory import track_peak
from helpers.timing import benchmark
from helpers.units import MiB
from helpers.validate import first_line, positive_int

#: Each lever's name in the table, and the chapter that taught it.
LEVER_TITLES = {
    "resident": "resident data, one sync per interval (ch2)",
    "sdpa": "scaled_dot_product_attention",
    "fused_adamw": "fused AdamW",
    "amp": "autocast by hardware (ch3)",
    "tf32": "TF32 matmuls (ch3)",
    "compile": "torch.compile",
    "checkpoint": "activation checkpointing (ch5)",
}
#: A GPU with this much memory gets the GPT-2-small-like model (an A100 40 GB reads 39.6 GiB).
BIG_GPU_BYTES = 32 * 2**30


def check_lever(name: str) -> str:
    """`name` if it is a lever, else a ValueError listing the levers (chapter 7)."""
    if name not in LEVER_TITLES:
        raise ValueError(f"unknown lever {name!r}; the levers are {', '.join(LEVER_TITLES)}.")
    return name


@dataclass(frozen=True)
class Levers:
    """Which levers a training run uses; all off is the baseline a learner first writes (chapter 7)."""

    resident: bool = False
    sdpa: bool = False
    fused_adamw: bool = False
    amp: bool = False
    tf32: bool = False
    compile: bool = False
    checkpoint: bool = False

    def on(self) -> list[str]:
        """Names of the levers that are on, in table order (chapter 7)."""
        return [f.name for f in fields(self) if getattr(self, f.name)]

    def plus(self, name: str) -> Levers:
        """These levers with `name` switched on (chapter 7)."""
        return replace(self, **{check_lever(name): True})

    def label(self) -> str:
        """'baseline', or the levers that are on joined by ' + ' (chapter 7)."""
        return " + ".join(self.on()) or "baseline"


def capstone_sizes(device: str | torch.device) -> tuple[GPTConfig, int]:
    """(model config, batch size) that train in seconds here: tiny on CPU, GPT-2-small-like on a big GPU (chapter 7)."""
    info = describe_device(device)
    memory = info.total_memory or 0
    if info.kind in ("cuda", "rocm") and memory >= BIG_GPU_BYTES:
        return GPTConfig(n_layer=12, n_head=12, d_model=768, seq_len=1024), 16
    if info.kind in ("cuda", "rocm"):  # T4, consumer cards
        return GPTConfig(n_layer=6, n_head=6, d_model=384, seq_len=256), 16
    if info.kind == "mps":
        return GPTConfig(n_layer=4, n_head=4, d_model=256, seq_len=256), 16
    return GPTConfig(n_layer=2, n_head=4, d_model=64, seq_len=256), 4


def lever_available(name: str, device: str | torch.device) -> tuple[bool, str]:
    """(can `name` run on `device`?, why not) (chapter 7)."""
    check_lever(name)
    device = resolve_device(device)
    if name == "amp":
        choice = amp_for_device(device)
        return choice.enabled, choice.reason
    if name == "tf32":
        ok = tf32_available(device)
        return ok, "" if ok else "TF32 needs an NVIDIA GPU of compute capability 8.0+ (Ampere+)"
    if name == "fused_adamw":
        ok = best_adam_impl(device) == "fused"
        return (
            ok,
            "" if ok else f"this torch {torch.__version__} has no fused AdamW for {device.type}",
        )
    if name == "compile" and device.type == "mps":
        return False, "torch.compile on MPS is still early in torch 2.x: left out here"
    return True, ""


class WindowDataset(Dataset):
    """Windows of `seq_len` tokens and the same window one token later, one per start offset (chapter 7)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int):
        self.tokens, self.seq_len = tokens, positive_int(seq_len, "seq_len")

    def __len__(self) -> int:
        return len(self.tokens) - self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.tokens[i : i + self.seq_len + 1]
        return window[:-1], window[1:]


def batch_starts(
    n_tokens: int, seq_len: int, batch_size: int, steps: int, seed: int = 0
) -> torch.Tensor:
    """(steps, batch_size) random window offsets: every lever trains on the same batches (chapter 7)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_tokens - seq_len - 1, (steps, batch_size), generator=generator)


class Trainer:
    """The GPT, its AdamW and its batches with some levers on; run() trains one log interval (chapter 7)."""

    def __init__(
        self,
        cfg: GPTConfig,
        levers: Levers,
        tokens: torch.Tensor,
        *,
        device: str | torch.device,
        batch_size: int,
        interval: int = 4,
        steps: int = 32,
        seed: int = 0,
        lr: float = 1e-3,
    ):
        self.device, self.levers = resolve_device(device), levers
        self.batch_size = positive_int(batch_size, "batch_size")
        self.interval = positive_int(interval, "interval")
        steps = positive_int(steps, "steps")
        self.cfg = replace(
            cfg, attention="sdpa" if levers.sdpa else "manual", checkpoint=levers.checkpoint
        )
        for name in levers.on():
            ok, why = lever_available(name, self.device)
            if not ok:
                raise ValueError(f"lever {name!r} cannot run on {self.device}: {why}.")
        self.model = make_gpt(self.cfg, seed=seed, device=self.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lr, fused=levers.fused_adamw or None
        )
        if (
            levers.compile
        ):  # forget earlier Trainers' graphs: many models would hit the recompile limit
            torch.compiler.reset()
        self.forward = torch.compile(self.model) if levers.compile else self.model
        choice = amp_for_device(self.device) if levers.amp else None
        self.amp_dtype = choice.dtype if choice else None
        self.scaler = (
            torch.amp.GradScaler(self.device.type) if choice and choice.use_scaler else None
        )
        starts = batch_starts(len(tokens), cfg.seq_len, batch_size, steps, seed)
        if levers.resident:  # tokens and offsets live on the device; a batch is one gather
            self.tokens = tokens.to(self.device)
            self.starts = starts.to(self.device)
            self.offsets = torch.arange(cfg.seq_len + 1, device=self.device)
        else:  # the loop a learner first writes: a DataLoader over windows
            order = starts.flatten().tolist()
            self.loader = DataLoader(
                WindowDataset(tokens, cfg.seq_len), batch_size=batch_size, sampler=order
            )
            self.batches: Iterator[Any] = iter(())
        self.step_count = 0

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step trains on (chapter 7)."""
        return self.batch_size * self.cfg.seq_len

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch on the device, the same sequence of batches whatever the feeding (chapter 7)."""
        if self.levers.resident:
            i = self.step_count % len(self.starts)
            windows = self.tokens[self.starts[i, :, None] + self.offsets]
            return windows[:, :-1], windows[:, 1:]
        try:
            x, y = next(self.batches)
        except StopIteration:  # a new epoch over the same offsets
            self.batches = iter(self.loader)
            x, y = next(self.batches)
        return x.to(self.device), y.to(self.device)

    def step(self) -> torch.Tensor:
        """One optimizer step; returns the loss as a tensor on the device (chapter 7)."""
        x, y = self._batch()
        with autocast_context(self.device.type, self.amp_dtype):
            loss = self.forward(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.step_count += 1
        return loss.detach()

    def run(self) -> list[float]:
        """Train one log interval; losses read with .item() each step (baseline) or once at the end (chapter 7)."""
        with tf32_matmuls(True) if self.levers.tf32 else nullcontext():
            if self.levers.resident:
                return torch.stack([self.step() for _ in range(self.interval)]).tolist()
            return [self.step().item() for _ in range(self.interval)]

    def saved_bytes(self) -> int:
        """Bytes one eager forward saves for backward at this batch, with this row's attention, autocast and checkpointing (chapter 7)."""
        x, y = self._peek_batch()
        autocast = autocast_context(self.device.type, self.amp_dtype)
        with ActivationMeter(self.model) as meter, autocast:
            self.model(x, y)
        return meter.total_bytes

    def _peek_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of this trainer's shape that does not advance its data (chapter 7)."""
        tokens = torch.zeros(
            self.batch_size, self.cfg.seq_len, dtype=torch.long, device=self.device
        )
        return tokens, tokens


def percent(fraction: float | None) -> str:
    """0.123 -> '12.3%'; None -> 'n/a' (an MFU without a peak) (chapter 7)."""
    return "n/a" if fraction is None else f"{100 * fraction:.1f}%"


@dataclass
class LeverRow:
    """One configuration measured: seconds per step and its spread, tokens/s, memory, MFU (chapter 7)."""

    label: str
    step_s: float
    spread: float
    tokens_per_s: float
    saved_mib: float
    peak_mib: float | None
    first_s: float
    first_losses: list[float]
    parent_losses: list[float] = field(default_factory=list)
    mfu: float | None = None
    mfu_achievable: float | None = None
    speedup: float = 1.0
    kept: str = ""

    def as_row(self) -> dict[str, Any]:
        """The row for print_table, numbers rounded for reading (chapter 7)."""
        return {
            "levers": self.label,
            "step ms": f"{1e3 * self.step_s:.2f} ±{100 * self.spread:.0f}%",
            "tokens/s": f"{self.tokens_per_s:,.0f}",
            "saved MiB": f"{self.saved_mib:.1f}",
            "peak MiB": "n/a" if self.peak_mib is None else f"{self.peak_mib:.0f}",
            "MFU datasheet": percent(self.mfu),
            "MFU achievable": percent(self.mfu_achievable),
            "speed-up": f"{self.speedup:.2f}x",
            "kept?": self.kept,
        }


def measure_trainer(
    trainer: Trainer,
    *,
    flops_per_token: float | None = None,
    peak_flops: float | None = None,
    achievable_flops: float | None = None,
    min_run_time: float = 1.0,
) -> LeverRow:
    """Time trainer.run() with helpers.timing.benchmark after a timed first call; memory and MFU (chapter 7)."""
    device = trainer.device
    synchronize(device)
    start = time.perf_counter()
    first_losses = trainer.run()  # the first interval: set-up, and compiling when compile is on
    first = time.perf_counter() - start
    with track_peak(device) as peak:
        trainer.run()
    result = benchmark(
        trainer.run, device=device, label=trainer.levers.label(), min_run_time=min_run_time
    )
    step_s = result.median / trainer.interval
    tokens_per_s = trainer.tokens_per_step / step_s
    flop_rate = tokens_per_s * flops_per_token if flops_per_token else None
    return LeverRow(
        label=trainer.levers.label(),
        step_s=step_s,
        spread=result.spread,
        tokens_per_s=tokens_per_s,
        saved_mib=trainer.saved_bytes() / MiB,
        peak_mib=peak.peak / MiB if device.type in ("cuda", "mps") else None,
        first_s=first,
        first_losses=first_losses,
        mfu=flop_rate / peak_flops if flop_rate and peak_flops else None,
        mfu_achievable=flop_rate / achievable_flops if flop_rate and achievable_flops else None,
    )


def keep_verdict(row: LeverRow, best: LeverRow) -> tuple[bool, str]:
    """Keep a lever only if its step is faster than the best so far by more than the noise (chapter 7)."""
    gain = best.step_s / row.step_s
    noise = max(0.02, row.spread, best.spread)
    if gain > 1 + noise:
        return True, f"kept: {gain:.2f}x faster than without it (noise ±{100 * noise:.0f}%)"
    if gain < 1 - noise:
        return False, f"dropped: {1 / gain:.2f}x slower here"
    return False, f"dropped: {gain:.2f}x is within the noise (±{100 * noise:.0f}%)"


class LeverSearch:
    """Each lever measured on top of the best so far, kept only if faster beyond the noise (chapter 7)."""

    def __init__(self, make: Callable[[Levers], Trainer], measure: Callable[[Trainer], LeverRow]):
        self.make, self.measure = make, measure
        self.current = Levers()
        baseline = make(self.current)
        self.device = baseline.device
        self.best = measure(baseline)
        self.best.kept = "the baseline"
        self.rows = [self.best]

    def try_lever(self, name: str) -> LeverRow | None:
        """Measure the best levers so far plus `name`; keep it on the evidence; None if it cannot run (chapter 7)."""
        ok, why = lever_available(name, self.device)
        if not ok:
            print(f"{name}: skipped here: {why}.")
            return None
        levers = self.current.plus(name)
        row, error = run_or_reason(lambda: self.measure(self.make(levers)))
        if row is None:
            print(f"{name}: dropped, it failed here: {error}")
            return None
        row.speedup = self.rows[0].step_s / row.step_s
        row.parent_losses = self.best.first_losses  # what the lever was added to
        keep, row.kept = keep_verdict(row, self.best)
        self.rows.append(row)
        if keep:
            self.current, self.best = levers, row
        print(f"{name}: {row.kept}; now {self.best.speedup:.2f}x the baseline")
        return row

    def table(self) -> list[dict[str, Any]]:
        """Every measured configuration as print_table rows (chapter 7)."""
        return [r.as_row() for r in self.rows]


def plot_levers(rows: list[LeverRow], title: str = "") -> Figure:
    """Tokens/s of each measured configuration as horizontal bars, kept levers highlighted (chapter 7)."""
    fig = Figure(figsize=(8, 0.45 * len(rows) + 1.2))
    ax = fig.subplots()
    labels = [r.label if len(r.label) < 48 else r.label[:45] + "..." for r in rows]
    colors = ["tab:green" if r.kept.startswith("kept") else "tab:gray" for r in rows]
    ax.barh(labels[::-1], [r.tokens_per_s for r in rows][::-1], color=colors[::-1])
    for i, r in enumerate(rows[::-1]):
        ax.text(r.tokens_per_s, i, f" {r.speedup:.2f}x", va="center", fontsize=8)
    ax.set_xlabel("tokens/s (median)")
    ax.set_title(title or "the capstone's levers: green = kept")
    fig.tight_layout()
    return fig


def same_losses(a: list[float], b: list[float], *, rtol: float, atol: float) -> float:
    """Assert two loss curves agree within tolerance; return the largest difference (chapter 7)."""
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=rtol, atol=atol)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """The kernel scaled_dot_product_attention ran for these inputs, read off the profiler (chapter 7)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    names = [
        e.key
        for e in prof.key_averages()
        if "attention" in e.key and e.key != "aten::scaled_dot_product_attention"
    ]
    return describe_sdpa_kernel(names)


def describe_sdpa_kernel(op_names: list[str]) -> str:
    """'flash', 'memory-efficient', 'cuDNN', 'flash (CPU kernel)' or 'math ...' from the attention ops a profile saw (chapter 7)."""
    for key, name in (
        ("flash_attention_for_cpu", "flash (CPU kernel)"),
        ("cudnn_attention", "cuDNN"),
        ("flash_attention", "flash"),
        ("efficient_attention", "memory-efficient"),
        ("math", "math (the unfused reference)"),
    ):
        if any(key in n for n in op_names):
            return name
    return "math (the unfused reference)" if op_names == [] else ", ".join(op_names)


def run_or_reason(fn: Callable[[], Any]) -> tuple[Any, str]:
    """(fn(), '') or (None, the first line of why it failed): a lever that fails is dropped, not fatal (chapter 7)."""
    try:
        return fn(), ""
    except (
        Exception
    ) as exc:  # a compiler missing, a kernel missing: the lever is dropped with the reason
        return None, f"{type(exc).__name__}: {first_line(exc)}"
