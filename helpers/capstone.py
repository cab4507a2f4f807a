"""The capstone's levers: the GPT trained with each on or off, measured into one table (chapter 7)."""

from __future__ import annotations

import atexit
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch.profiler import ProfilerActivity, profile
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from helpers.activations import ActivationMeter
from helpers.amp_choice import amp_for_device
from helpers.cuda_graphs import graph_capture_plan
from helpers.devices import describe_device, resolve_device, synchronize
from helpers.fp8 import convert_fp8, fp8_available
from helpers.gpt import GPTConfig, decay_groups, make_gpt
from helpers.i18n import tr, tr_mark
from helpers.loops import best_adam_impl
from helpers.machine_state import MachineState
from helpers.matmul import tf32_available, tf32_matmuls
from helpers.memory import track_peak
from helpers.peaks import peak_row
from helpers.profiler_markers import without_profiler_markers
from helpers.same_math import NoiseFloor, SameMath, check_not_run, noise_floor, same_math
from helpers.timing import benchmark
from helpers.units import MiB
from helpers.validate import first_line, positive_int
from helpers.verdicts import compare_rows


class _Titles(dict):
    """Lever name -> its title, read in the current language (LEVER_TITLES[name]); the values stay English."""

    def __getitem__(self, name: str) -> str:
        return tr(super().__getitem__(name))


#: Each lever's name in the table, and the chapter that taught it (LEVER_TITLES[name]: translated).
LEVER_TITLES = _Titles(
    {
        "resident": tr_mark("resident data, one sync per interval (ch2)"),
        "sdpa": "scaled_dot_product_attention",
        "fused_adamw": tr_mark("fused AdamW"),
        "amp": tr_mark("autocast by hardware (ch3)"),
        "tf32": tr_mark("TF32 matmuls (ch3)"),
        "compile": "torch.compile",
        "graphs": tr_mark("CUDA graphs of forward and backward (ch2)"),
        "checkpoint": tr_mark("activation checkpointing (ch5)"),
        "fp8": tr_mark("FP8 matmuls (torchao)"),
    }
)
#: Levers that run the very same kernels, only fed, kept or launched differently.
SAME_KERNELS = ("resident", "checkpoint", "graphs")
#: Levers that compute the same sums in another order: fp32 rounding differs at the ulp level.
REORDERS = ("sdpa", "fused_adamw", "compile")
#: Levers that change the rounding on purpose: their loss gap is printed, never checked.
ROUNDING = ("amp", "tf32", "fp8")
#: The speed levers in the chapter's greedy order; checkpointing saves memory, not time.
GREEDY = ("resident", "sdpa", "fused_adamw", "amp", "tf32", "compile", "graphs")
#: A GPU with this much memory gets the bigger models (an A100 40 GB reads 39.6 GiB).
BIG_GPU_BYTES = 32 * 2**30
#: nanoGPT's GPT-2-small shape and batch, which the public recipe's figure was measured at.
RECIPE_SIZES = (GPTConfig(n_layer=12, n_head=12, d_model=768, seq_len=1024), 16)
#: A timing's relative spread is never taken as less than this: two back-to-back timings of
#: the same kernels differed by 1% on the course's H100 run of 2026-11-26 (bench-ch07:
#: resident vs baseline, 1.01x, both with an IQR of 0%), so a verdict needs 2% between rows.
SPREAD_FLOOR = 0.01
#: What cost_verdict is given as `what` in the chapter (translated where it is printed).
COST_WORDS = (tr_mark("checkpointing"),)
#: The first words of a verdict that keeps its lever (is_kept reads them in either language).
KEPT = tr_mark("kept: {gain:.2f}x faster than without it {at} (noise ±{noise:.0%})")


#: The words of a configuration's label that the learner's language has its own word for:
#: the baseline and the one lever named by an English word. The other levers show their code
#: names (sdpa, fused_adamw, amp, ...), as the learner types them; the code keeps the English.
_SHOWN_WORDS = {"baseline": tr_mark("baseline"), "resident": tr_mark("resident")}


def shown_label(label: str) -> str:
    """A configuration's label ('baseline', 'resident + sdpa') as tables, verdicts and plots show it: 'baseline' and 'resident' in the learner's language, the other lever names as in code (chapter 7)."""
    return " + ".join(tr(_SHOWN_WORDS.get(part, part)) for part in label.split(" + "))


def versus(a: str, b: str) -> str:
    """'a vs b' in the learner's language, both labels as shown_label shows them: a same-math check's name (chapter 7)."""
    return tr("{a} vs {b}").format(a=shown_label(a), b=shown_label(b))


def check_lever(name: str) -> str:
    """`name` if it is a lever, else a ValueError listing the levers (chapter 7)."""
    if name not in LEVER_TITLES:
        raise ValueError(
            tr("unknown lever {name!r}; the levers are {levers}.").format(
                name=name, levers=", ".join(LEVER_TITLES)
            )
        )
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
    graphs: bool = False
    checkpoint: bool = False
    fp8: bool = False

    def on(self) -> list[str]:
        """Names of the levers that are on, in table order (chapter 7)."""
        return [f.name for f in fields(self) if getattr(self, f.name)]

    def plus(self, name: str) -> Levers:
        """These levers with `name` switched on (chapter 7)."""
        return replace(self, **{check_lever(name): True})

    def minus(self, name: str) -> Levers:
        """These levers with `name` switched off (chapter 7)."""
        return replace(self, **{check_lever(name): False})

    def toggled(self, name: str) -> Levers:
        """`name` switched off if it is on, on if it is off (chapter 7)."""
        return self.minus(name) if getattr(self, check_lever(name)) else self.plus(name)

    def label(self) -> str:
        """'baseline', or the levers that are on joined by ' + ' (chapter 7)."""
        return " + ".join(self.on()) or "baseline"

    def shown(self) -> str:
        """label() as the learner reads it, in tables and verdicts (shown_label) (chapter 7)."""
        return shown_label(self.label())


def capstone_sizes(device: str | torch.device, recipe: bool = False) -> tuple[GPTConfig, int]:
    """(model config, batch size) that train in seconds here: tiny on CPU, 6 x 768 on a big GPU, nanoGPT's GPT-2-small shape there with `recipe` (chapter 7)."""
    info = describe_device(device)
    memory = info.total_memory or 0
    if info.kind in ("cuda", "rocm") and memory >= BIG_GPU_BYTES:
        # at the recipe's shape an fp32 step took 305 ms on the course's H100 (2026-11-26), and
        # the notebook, on that GPU shared with other jobs (2026-11-27), was still in its
        # ablation after 459 s: the chapter's search runs half as deep at half the context
        if recipe:
            return RECIPE_SIZES
        return GPTConfig(n_layer=6, n_head=12, d_model=768, seq_len=512), 16
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
        return ok, "" if ok else tr("TF32 needs an NVIDIA GPU of compute capability 8.0+ (Ampere+)")
    if name == "fused_adamw":
        ok = best_adam_impl(device) == "fused"
        return (
            ok,
            ""
            if ok
            else tr("this torch {version} has no fused AdamW for {device}").format(
                version=torch.__version__, device=device.type
            ),
        )
    if name in ("compile", "graphs") and device.type == "mps":
        return False, tr("torch.compile on MPS is still early in torch 2.x: left out here")
    if name == "graphs":
        ok, why = graph_capture_plan(device)
        why = tr("CUDA graphs need a CUDA or ROCm GPU and this is {device}")
        return ok, "" if ok else why.format(device=device.type)
    if name == "fp8":
        return fp8_available(device)
    return True, ""


@dataclass(frozen=True)
class Regime:
    """How the capstone trains: AdamW as GPT-2 is trained, warm-up then cosine decay, clipping (chapter 7)."""

    lr: float = 6e-4  # the peak learning rate, reached at the end of the warm-up
    min_lr: float = 6e-5  # where the cosine decay ends, and stays
    warmup: int = 8  # steps of linear warm-up, from lr / warmup
    decay: int = 56  # steps of cosine decay after the warm-up
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1  # on matrices and embeddings only (helpers.gpt.decay_groups)
    clip: float = 1.0  # the largest gradient norm; larger gradients are scaled down to it

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step `step` (0-based) (chapter 7)."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        done = min(1.0, (step - self.warmup) / self.decay)
        return self.min_lr + 0.5 * (1 + math.cos(math.pi * done)) * (self.lr - self.min_lr)

    def __str__(self) -> str:
        return tr(
            "AdamW, betas {betas}, weight decay {weight_decay:g} on matrices; learning rate "
            "warmed up over {warmup} steps to {lr:g}, cosine decay to {min_lr:g} by step {end}; "
            "gradient norm clipped at {clip:g}"
        ).format(
            betas=self.betas,
            weight_decay=self.weight_decay,
            warmup=self.warmup,
            lr=self.lr,
            min_lr=self.min_lr,
            end=self.warmup + self.decay,
            clip=self.clip,
        )


def regime_for(cfg: GPTConfig) -> Regime:
    """GPT-2 small's recipe (nanoGPT's train.py: peak 6e-4) at width 768+, nanoGPT's 1e-3 for its smaller models (chapter 7)."""
    lr = 6e-4 if cfg.d_model >= 768 else 1e-3
    return Regime(lr=lr, min_lr=lr / 10)


def make_optimizer(
    model: torch.nn.Module, regime: Regime, fused: bool = False
) -> torch.optim.AdamW:
    """The capstone's AdamW: decay groups, the regime's betas, fused or torch's default (chapter 7)."""
    return torch.optim.AdamW(
        decay_groups(model, regime.weight_decay),
        lr=regime.lr_at(0),
        betas=regime.betas,
        fused=fused or None,
    )


def set_lr(optimizer: torch.optim.Optimizer, regime: Regime, step: int) -> None:
    """Give every parameter group the regime's learning rate for step `step` (chapter 7)."""
    for group in optimizer.param_groups:
        group["lr"] = regime.lr_at(step)


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


def compile_model(model: torch.nn.Module, levers: Levers) -> Callable[..., torch.Tensor]:
    """The model itself, or torch.compile'd: Inductor, with CUDA graphs ('reduce-overhead') or alone; graphs alone: the 'cudagraphs' backend (chapter 7)."""
    if levers.compile and levers.graphs:
        return torch.compile(model, mode="reduce-overhead")
    if levers.compile:
        return torch.compile(model)
    if levers.graphs:  # CUDA graphs of the eager kernels, captured through AOTAutograd
        return torch.compile(model, backend="cudagraphs")
    return model


class Trainer:
    """The GPT, its AdamW, its schedule and its batches with some levers on; run() trains one log interval (chapter 7)."""

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
        regime: Regime | None = None,
    ):
        self.device, self.levers = resolve_device(device), levers
        self.batch_size = positive_int(batch_size, "batch_size")
        self.interval = positive_int(interval, "interval")
        steps = positive_int(steps, "steps")
        self.cfg = replace(
            cfg, attention="sdpa" if levers.sdpa else "manual", checkpoint=levers.checkpoint
        )
        self.regime = regime or regime_for(self.cfg)
        for name in levers.on():
            ok, why = lever_available(name, self.device)
            if not ok:
                raise ValueError(
                    tr("lever {name!r} cannot run on {device}: {why}.").format(
                        name=name, device=self.device, why=why
                    )
                )
        self.model = make_gpt(self.cfg, seed=seed, device=self.device)
        if levers.fp8:  # lever_available refused above every device without FP8 tensor cores
            convert_fp8(self.model)
        self.params = list(self.model.parameters())
        self.initial = [p.detach().clone() for p in self.params]  # for restart()
        self.optimizer = make_optimizer(self.model, self.regime, fused=levers.fused_adamw)
        if levers.compile or levers.graphs:  # forget earlier Trainers' graphs (recompile limit)
            torch.compiler.reset()
        self.forward = compile_model(self.model, levers)
        choice = amp_for_device(self.device) if levers.amp else None
        self.amp_dtype = choice.dtype if choice else None
        self.use_scaler = bool(choice and choice.use_scaler)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.use_scaler else None
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

    def _autocast(self) -> torch.autocast | nullcontext[None]:
        """Autocast to this row's 16-bit dtype, or nothing (chapter 7)."""
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def step(self) -> torch.Tensor:
        """One optimizer step at the regime's learning rate, gradients clipped; the loss, on the device (chapter 7)."""
        x, y = self._batch()
        set_lr(self.optimizer, self.regime, self.step_count)
        self.optimizer.zero_grad(set_to_none=True)  # last step's gradients dropped first
        if self.levers.graphs:  # a new iteration: the graphs may reuse the last one's memory
            torch.compiler.cudagraph_mark_step_begin()
        with self._autocast():
            loss = self.forward(x, y)
        if self.scaler:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(self.params, self.regime.clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, self.regime.clip)
            self.optimizer.step()
        self.step_count += 1
        # a CUDA graph's output is overwritten by the next replay: keep a copy of the loss
        return loss.detach().clone() if self.levers.graphs else loss.detach()

    def run(self) -> list[float]:
        """Train one log interval; losses read with .item() each step (baseline) or once at the end (chapter 7)."""
        with tf32_matmuls(True) if self.levers.tf32 else nullcontext():
            if self.levers.resident:
                return torch.stack([self.step() for _ in range(self.interval)]).tolist()
            return [self.step().item() for _ in range(self.interval)]

    def losses(self, steps: int) -> list[float]:
        """The losses of the next `steps` steps, whole intervals run (chapter 7)."""
        out: list[float] = []
        while len(out) < steps:
            out += self.run()
        return out[:steps]

    def restart(self, nudge: bool = False) -> None:
        """Back to step 0: the initial weights (each one ulp up with `nudge`), no optimizer state, the first batch (chapter 7)."""
        with torch.no_grad():
            for p, p0 in zip(self.params, self.initial):
                p.copy_(torch.nextafter(p0, torch.full_like(p0, math.inf)) if nudge else p0)
        self.optimizer.state.clear()  # AdamW starts its moments and step counts afresh
        if self.use_scaler:
            self.scaler = torch.amp.GradScaler(self.device.type)
        if not self.levers.resident:
            self.batches = iter(())
        self.step_count = 0

    def saved_bytes(self) -> int:
        """Bytes one eager forward saves for backward at this batch, with this row's attention, autocast and checkpointing (chapter 7)."""
        x, y = self._peek_batch()
        with ActivationMeter(self.model) as meter, self._autocast():
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
    return tr("n/a") if fraction is None else f"{100 * fraction:.1f}%"


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
    levers: Levers | None = None
    parent: Levers | None = None  # the configuration this row's lever was added to or removed from
    machine: MachineState | None = None  # what else the machine did while it was timed
    compile_cache: str = ""  # how the first interval's compile met Inductor's FX-graph cache
    check: SameMath | None = None  # its losses against its parent's (LeverSearch fills it in)

    def timing_row(self) -> dict[str, Any]:
        """The row's numbers for helpers.verdicts.compare_rows: step seconds and IQR, at least SPREAD_FLOOR (chapter 7)."""
        return {
            "levers": shown_label(self.label),  # the name a verdict prints
            "step_s": self.step_s,
            "iqr_s": max(self.spread, SPREAD_FLOOR) * self.step_s,
        }

    def as_row(self) -> dict[str, Any]:
        """The row for print_table, numbers rounded for reading (chapter 7)."""
        return {
            tr_mark("levers"): shown_label(self.label),
            tr_mark("step ms"): f"{1e3 * self.step_s:.2f} ±{100 * self.spread:.0f}%",
            "tokens/s": f"{self.tokens_per_s:,.0f}",
            tr_mark("saved MiB"): f"{self.saved_mib:.1f}",
            tr_mark("peak MiB"): tr("n/a") if self.peak_mib is None else f"{self.peak_mib:.0f}",
            tr_mark("MFU datasheet"): percent(self.mfu),
            tr_mark("MFU achievable"): percent(self.mfu_achievable),
            tr_mark("speed-up"): f"{self.speedup:.2f}x",
            tr_mark("kept?"): self.kept,
        }


def fx_graph_cache_counts() -> tuple[int, int]:
    """(hits, misses) of Inductor's FX-graph cache in this process so far, from torch._dynamo's counters; (0, 0) before anything compiled (chapter 7)."""
    utils = sys.modules.get("torch._dynamo.utils")  # imported by the first torch.compile call
    inductor = getattr(utils, "counters", {}).get("inductor", {})
    return int(inductor.get("fxgraph_cache_hit", 0)), int(inductor.get("fxgraph_cache_miss", 0))


def compile_cache_label(levers: Levers, before: tuple[int, int], after: tuple[int, int]) -> str:
    """How a first interval's compile met Inductor's FX-graph cache, from the counts before and after it; '' when nothing compiles (chapter 7)."""
    if not levers.compile:  # graphs alone: the 'cudagraphs' backend captures eager kernels
        return tr("n/a (no Inductor)") if levers.graphs else ""
    hits, misses = after[0] - before[0], after[1] - before[1]
    if hits == misses == 0:
        return tr("unknown (no FX-graph cache lookup counted: the cache may be off in this torch)")
    if hits == 0:
        return tr("cold cache ({misses} graph(s) compiled)").format(misses=misses)
    if misses == 0:
        return tr("warm cache ({hits} graph(s) loaded)").format(hits=hits)
    return tr("partly warm cache ({hits} graph(s) loaded, {misses} compiled)").format(
        hits=hits, misses=misses
    )


def use_fresh_compile_cache() -> Path:
    """Point Inductor's and Triton's caches at a new empty folder, removed when Python exits: the next compile is cold (chapter 7)."""
    path = Path(tempfile.mkdtemp(prefix="course-inductor-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ["TRITON_CACHE_DIR"] = str(path / "triton")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def measure_trainer(
    trainer: Trainer,
    *,
    flops_per_token: float | None = None,
    peak_flops: float | None = None,
    achievable_flops: float | None = None,
    min_run_time: float = 1.0,
    check_steps: int | None = None,
) -> LeverRow:
    """The first `check_steps` losses (the first interval timed: set-up, compiling), then helpers.timing.benchmark; memory and MFU (chapter 7)."""
    device = trainer.device
    counts = fx_graph_cache_counts()
    synchronize(device)
    start = time.perf_counter()
    first_losses = trainer.run()  # the first interval: set-up, and compiling when compile is on
    first = time.perf_counter() - start
    cache = compile_cache_label(trainer.levers, counts, fx_graph_cache_counts())
    if check_steps and check_steps > len(first_losses):
        first_losses += trainer.losses(check_steps - len(first_losses))
    with track_peak(device) as peak:
        trainer.run()
    # warmup=0: the intervals above (set-up, compiling, the graphs' recording) were its warm-up
    result = benchmark(
        trainer.run,
        device=device,
        label=trainer.levers.label(),
        warmup=0,
        min_run_time=min_run_time,
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
        first_losses=first_losses[: check_steps or len(first_losses)],
        mfu=flop_rate / peak_flops if flop_rate and peak_flops else None,
        mfu_achievable=flop_rate / achievable_flops if flop_rate and achievable_flops else None,
        levers=trainer.levers,
        machine=result.machine,
        compile_cache=cache,
    )


def timing_gain(row: LeverRow, best: LeverRow) -> tuple[float, float, str]:
    """(how many times faster `row` steps than `best`, the noise of that ratio, a busy machine's caveat or ''), read off both rows by helpers.verdicts.compare_rows (chapter 7)."""
    machines = [m for m in (row.machine, best.machine) if m is not None]
    verdict = compare_rows(
        [row.timing_row(), best.timing_row()],
        "levers",
        shown_label(row.label),
        shown_label(best.label),
        "step_s",
        iqr="iqr_s",
        machine=machines,
    )
    busy = [m.caveat() for m in machines if not m.quiet]
    return verdict.ratio, verdict.noise, busy[0] if busy else ""


def at_step(step_s: float) -> str:
    """'at a 30.81 ms step', in the current language: where a verdict's step time was (chapter 7)."""
    return tr("at a {ms:.4g} ms step").format(ms=1e3 * step_s)


def busy_note(busy: str) -> str:
    """The caveat a verdict ends with when the machine was busy, or '' (chapter 7)."""
    return tr("; on a busy machine: re-run to confirm") if busy else ""


def is_kept(verdict: str) -> bool:
    """Whether a row's verdict (its `kept` text) keeps its lever, in English or the current language (chapter 7)."""
    return verdict.startswith(("kept", tr(KEPT).partition("{")[0] or "kept"))


def keep_verdict(row: LeverRow, best: LeverRow) -> tuple[bool, str]:
    """Keep `row`'s lever only if its step beats `best`'s (the same levers without it) beyond both spreads (chapter 7)."""
    gain, noise, busy = timing_gain(row, best)
    at = at_step(best.step_s)
    if abs(gain - 1) <= noise:
        keep = False
        text = tr("dropped: not shown to help {at} ({gain:.2f}x, noise ±{noise:.0%})")
    elif gain > 1:
        keep, text = True, tr(KEPT)
    else:
        keep = False
        text = tr("dropped: {slower:.2f}x slower {at} (noise ±{noise:.0%})")
    text = text.format(at=at, gain=gain, slower=1 / gain, noise=noise)
    return keep, text + busy_note(busy)


def removal_verdict(
    name: str, without: LeverRow, final: LeverRow, origin: str = ""
) -> tuple[bool, str]:
    """Remove lever `name` from the final configuration only if the step is faster without it beyond both spreads; `origin`: the pass that kept it (chapter 7)."""
    gain, noise, busy = timing_gain(without, final)
    at = at_step(without.step_s)
    kept_by = ""
    if abs(gain - 1) <= noise:
        remove = False
        kept_by = (
            tr("kept by {origin}").format(origin=origin)
            if origin
            else tr("on in {levers}").format(levers=shown_label(final.label))
        )
        text = tr(
            "{name} stays ({kept_by}): not shown to help {at} now ({ratio:.2f}x, noise ±{noise:.0%})"
        )
    elif gain > 1:
        remove = True
        text = tr("{name} removed: {gain:.2f}x faster without it (noise ±{noise:.0%})")
    else:
        remove = False
        text = tr("{name} stays: {ratio:.2f}x faster than without it {at} (noise ±{noise:.0%})")
    text = text.format(
        name=shown_label(name), kept_by=kept_by, at=at, gain=gain, ratio=1 / gain, noise=noise
    )
    return remove, text + busy_note(busy)


def cost_verdict(row: LeverRow, without: LeverRow, what: str) -> str:
    """What lever `what` costs in time: `row` (with it) against `without`, the same levers without it, beyond both spreads (chapter 7)."""
    gain, noise, busy = timing_gain(without, row)  # > 1: the step is faster without the lever
    at = at_step(without.step_s)
    if abs(gain - 1) <= noise:
        text = tr("no cost of {what} shown {at} ({gain:.2f}x, noise ±{noise:.0%})")
    else:
        text = tr("with {what} the step took {gain:.2f}x as long {at} (noise ±{noise:.0%})")
    what = tr(what) if what else what  # tr('') would be the catalog's header
    return text.format(what=what, at=at, gain=gain, noise=noise) + busy_note(busy)


def throughput_verdict(a: LeverRow, b: LeverRow, a_name: str, b_name: str) -> str:
    """Which of two rows trains more tokens per second, beyond their spreads, through helpers.verdicts.compare_rows (chapter 7)."""
    rows = [
        {
            "configuration": name,
            "tokens/s": r.tokens_per_s,
            "iqr": max(r.spread, SPREAD_FLOOR) * r.tokens_per_s,
        }
        for name, r in ((a_name, a), (b_name, b))
    ]
    machines = [m for m in (a.machine, b.machine) if m is not None]
    return compare_rows(
        rows, "configuration", a_name, b_name, "tokens/s", iqr="iqr",
        higher_is_better=True, better="more tokens/s", machine=machines,
    )  # fmt: skip


def math_change(name: str, context: Levers) -> str:
    """'' where lever `name` keeps the math in `context` (so it is checked), else what it changes (chapter 7)."""
    check_lever(name)
    if name in ROUNDING:
        return tr("rounding changed by {name} on purpose").format(name=name)
    rounding = [n for n in context.on() if n in ROUNDING]
    if name in ("sdpa", "compile") and rounding:
        return tr(
            "{name} rounds the {rounding} sums in another order: a 16-bit rounding change"
        ).format(name=name, rounding=" + ".join(rounding))
    return ""


def changed_lever(a: Levers, b: Levers) -> str:
    """The one lever that differs between `a` and `b`; a ValueError otherwise (chapter 7)."""
    names = [n for n in LEVER_TITLES if getattr(a, n) != getattr(b, n)]
    if len(names) != 1:
        raise ValueError(
            tr("{a!r} and {b!r} differ by {names}, not by one lever.").format(
                a=a.label(), b=b.label(), names=names
            )
        )
    return names[0]


class LeverSearch:
    """Greedy: each lever on top of the best so far, kept if faster beyond the noise; then an ablation until nothing changes (chapter 7)."""

    def __init__(self, make: Callable[[Levers], Trainer], measure: Callable[[Trainer], LeverRow]):
        self.make, self.measure = make, measure
        self.current = Levers()
        baseline = make(self.current)
        self.device = baseline.device
        self.best = measure(baseline)
        self.best.kept, self.best.levers = tr("the baseline"), self.current
        self.rows = [self.best]
        self.ablation: list[LeverRow] = []
        self.side: list[LeverRow] = []  # rows measured beside the search (FP8, checkpointing)
        self.trainers: dict[Levers, Trainer] = {self.current: baseline}
        self.floors: dict[Levers, NoiseFloor] = {}
        self.origins: dict[str, str] = {}  # lever -> the pass that switched it on in the final

    @property
    def baseline(self) -> LeverRow:
        """The baseline's row (chapter 7)."""
        return self.rows[0]

    def _keep_trainer(self, levers: Levers, trainer: Trainer, parent: Levers | None) -> None:
        """Keep the trainers of the baseline, the best configuration and its parent (for their noise floors), drop the others (chapter 7)."""
        self.trainers[levers] = trainer
        keep = (Levers(), self.current, parent)
        for old in [lv for lv in self.trainers if lv not in keep]:
            del self.trainers[old]

    def _measure(self, levers: Levers, parent: LeverRow) -> tuple[LeverRow | None, str]:
        """Measure `levers` (one lever away from `parent`); (row, '') or (None, why it failed) (chapter 7)."""
        made: dict[str, Trainer] = {}

        def run() -> LeverRow:
            made["trainer"] = self.make(levers)
            return self.measure(made["trainer"])

        row, error = run_or_reason(run)
        if row is not None:
            row.levers, row.parent, row.parent_losses = levers, parent.levers, parent.first_losses
            row.speedup = self.baseline.step_s / row.step_s
            self._last_trainer = made["trainer"]
        return row, error

    def try_lever(self, name: str) -> LeverRow | None:
        """Measure the best levers so far plus `name`; keep it beyond the noise; None if it cannot run (chapter 7)."""
        ok, why = lever_available(name, self.device)
        if not ok:
            print(tr("{name}: skipped here: {why}.").format(name=shown_label(name), why=why))
            return None
        levers = self.current.plus(name)
        row, error = self._measure(levers, self.best)
        if row is None:
            failed = tr("{name}: dropped, it failed here: {error}")
            print(failed.format(name=shown_label(name), error=error))
            return None
        keep, row.kept = keep_verdict(row, self.best)
        self.rows.append(row)
        self._check(row)
        if keep:
            parent, self.current, self.best = self.current, levers, row
            self.origins[name] = tr("the greedy pass")
            self._keep_trainer(levers, self._last_trainer, parent)
        now = tr("{name}: {verdict}; now {speedup:.2f}x the baseline")
        print(now.format(name=shown_label(name), verdict=row.kept, speedup=self.best.speedup))
        return row

    def side_row(self, levers: Levers, parent: LeverRow) -> tuple[LeverRow | None, str]:
        """Measure `levers` against `parent` (one lever apart) without changing the final: verdict and loss check filled in (chapter 7)."""
        row, error = self._measure(levers, parent)
        if row is None:
            return None, error
        name = changed_lever(levers, parent.levers)
        if getattr(levers, name):
            row.kept = keep_verdict(row, parent)[1]
        else:
            origin = self.origins.get(name, "") if parent.levers == self.current else ""
            row.kept = removal_verdict(name, row, parent, origin)[1]
        self.side.append(row)
        self._check(row)
        return row, ""

    def measured(self, levers: Levers) -> LeverRow:
        """The latest row of exactly `levers`, or a new measurement of them (no verdict) (chapter 7)."""
        row = self.row_for(levers)
        if row is None:
            row = self.measure(self.make(levers))
            row.levers, row.kept = levers, tr("measured as a reference")
            row.speedup = self.baseline.step_s / row.step_s
            self.side.append(row)
        return row

    @property
    def final_row(self) -> LeverRow:
        """The final configuration's latest measurement: the ablation's last pass, else the greedy best (chapter 7)."""
        return self.row_for(self.current) or self.best

    def final_verdict(self) -> str:
        """The final configuration against the baseline, read off both rows by compare_rows (chapter 7)."""
        if self.current == Levers():
            return tr("nothing beat the baseline here: the final configuration is the baseline")
        final, base = self.final_row, self.baseline
        machines = [m for m in (final.machine, base.machine) if m is not None]
        rows = [final.timing_row(), base.timing_row()]
        a, b = shown_label(final.label), shown_label(base.label)
        return str(compare_rows(rows, "levers", a, b, "step_s", iqr="iqr_s", machine=machines))

    def row_for(self, levers: Levers) -> LeverRow | None:
        """The latest row measured with exactly `levers`, greedy or ablation, or None (chapter 7)."""
        found = [r for r in self.rows + self.ablation + self.side if r.levers == levers]
        return found[-1] if found else None

    def floor(self, levers: Levers) -> NoiseFloor:
        """The noise floor of a measured configuration: its trainer rerun, and rerun with every weight one ulp up (chapter 7)."""
        if levers not in self.floors:
            row = self.row_for(levers)
            if row is None:
                raise ValueError(
                    tr("{levers!r} was not measured: measure it first.").format(
                        levers=levers.label()
                    )
                )
            trainer = self.trainers.get(levers) or self.make(levers)
            steps = len(row.first_losses)
            runs = []
            for nudge in (False, True):
                trainer.restart(nudge=nudge)
                runs.append(trainer.losses(steps))
            self.floors[levers] = noise_floor(shown_label(row.label), row.first_losses, *runs)
        return self.floors[levers]

    def change_of(self, row: LeverRow) -> str:
        """What `row`'s lever changes in the math against its parent: '' where it must keep it (chapter 7)."""
        if row.levers is None or row.parent is None:
            raise ValueError(
                tr("{label!r} has no parent configuration to compare with.").format(label=row.label)
            )
        name = changed_lever(row.levers, row.parent)
        return math_change(name, row.levers if getattr(row.levers, name) else row.parent)

    def same_math(self, row: LeverRow) -> SameMath:
        """`row`'s losses against those of the configuration it differs from by one lever, held to that one's noise floor (chapter 7)."""
        change = self.change_of(row)
        parent = self.row_for(row.parent)
        if parent is None:
            raise ValueError(
                tr("{levers!r} was not measured: measure it first.").format(
                    levers=row.parent.label()
                )
            )
        label = versus(row.label, parent.label)
        floor = None if change else self.floor(row.parent)
        return same_math(label, row.first_losses, parent.first_losses, floor, change)

    def _check(self, row: LeverRow) -> None:
        """Fill in row.check; a check that cannot run fails with why where the lever must keep the math, and is a note where it rounds on purpose (chapter 7)."""
        check, error = run_or_reason(lambda: self.same_math(row))
        if check is not None:
            row.check = check
            return
        change = run_or_reason(lambda: self.change_of(row))[0]  # None: not even that is known
        parent = row.parent.label() if row.parent is not None else tr("its parent")
        label = versus(row.label, parent)
        if change:
            note = tr("{change}; not compared: {error}").format(change=change, error=error)
            row.check = SameMath(label, [], None, note)
        else:
            row.check = check_not_run(label, error)

    def _final_for_ablation(self, number: int) -> LeverRow:
        """The final configuration's row for ablation pass `number`: its latest measurement (the greedy pass's, or the switch the last pass applied) with its trainer kept, else a new one (chapter 7)."""
        measured, trainer = self.row_for(self.current), self.trainers.get(self.current)
        if measured is not None and trainer is not None:  # no second run of the same levers
            final = replace(measured, check=None)
        else:
            made, error = self._measure(self.current, self.best)
            if made is None:
                raise RuntimeError(
                    tr("the final configuration failed to run again: {error}").format(error=error)
                )
            final, trainer = made, self._last_trainer
        final.kept = tr("the final configuration (pass {number})").format(number=number)
        final.parent = None
        self.ablation.append(final)
        self._keep_trainer(self.current, trainer, None)
        return final

    def ablate(
        self, names: Sequence[str] = GREEDY, max_passes: int = 4, progress: bool = True
    ) -> bool:
        """From the final configuration, each lever switched (on if off, off if on), the best change beyond the noise applied, until none helps; True if it settled; `progress`: a bar per pass (chapter 7)."""
        for number in range(1, max_passes + 1):
            final = self._final_for_ablation(number)
            best_gain, best_row, best_trainer = 1.0, None, None
            switches = [n for n in names if lever_available(n, self.device)[0]]
            desc = tr("ablation pass {number}").format(number=number)
            for name in tqdm(switches, desc=desc, leave=True, disable=not progress):
                levers = self.current.toggled(name)
                row, error = self._measure(levers, final)
                if row is None:
                    failed = tr("{levers}: failed here: {error}")
                    print("  " + failed.format(levers=levers.shown(), error=error))
                    continue
                self.ablation.append(row)
                self._check(row)
                if getattr(levers, name):  # switched on: kept if it beats the final
                    better, row.kept = keep_verdict(row, final)
                else:  # switched off: removed only if the final is slower with it
                    origin = self.origins.get(name, "")
                    better, row.kept = removal_verdict(name, row, final, origin)
                gain = final.step_s / row.step_s
                if better and gain > best_gain:  # its trainer becomes the next pass's final's
                    best_gain, best_row, best_trainer = gain, row, self._last_trainer
            if best_row is None:
                settled = tr("ablation pass {number}: no lever switched on or off beats the final")
                print(settled.format(number=number))
                return True
            print(
                tr("ablation pass {number}: {levers} beats the final, {best_gain:.2f}x").format(
                    number=number, levers=shown_label(best_row.label), best_gain=best_gain
                )
            )
            switched = changed_lever(best_row.levers, self.current)
            if getattr(best_row.levers, switched):
                self.origins[switched] = tr("ablation pass {number}").format(number=number)
            else:
                self.origins.pop(switched, None)
            self.current, self.best = best_row.levers, best_row
            self._keep_trainer(self.current, best_trainer, None)
        print(
            tr("ablation: stopped after {passes} passes, still changing").format(passes=max_passes)
        )
        return False

    def not_shown_to_help(self) -> list[str]:
        """Levers the last ablation pass switched on from the final configuration without beating it (chapter 7)."""
        last = [i for i, r in enumerate(self.ablation) if r.parent is None]
        if not last:
            return []
        rows = self.ablation[last[-1] + 1 :]
        return [
            changed_lever(r.levers, r.parent)
            for r in rows
            if r.parent == self.current
            and not is_kept(r.kept)
            and getattr(r.levers, changed_lever(r.levers, r.parent))
        ]

    def ablation_table(self) -> list[dict[str, Any]]:
        """The ablation's rows for print_table: each configuration, its change, its verdict (chapter 7)."""
        out = []
        for row in self.ablation:
            cells = row.as_row()
            change = "" if row.parent is None else changed_lever(row.levers, row.parent)
            sign = "+" if change and getattr(row.levers, change) else "-"
            shown = f"{sign} {shown_label(change)}" if change else tr("(final)")
            cells = {tr_mark("change"): shown, **cells}
            out.append(cells)
        return out

    def table(self) -> list[dict[str, Any]]:
        """Every configuration the greedy pass measured, as print_table rows (chapter 7)."""
        return [r.as_row() for r in self.rows]


def plot_levers(rows: list[LeverRow], title: str = "") -> Figure:
    """Tokens/s of each measured configuration as horizontal bars, kept levers highlighted (chapter 7)."""
    fig = Figure(figsize=(8, 0.45 * len(rows) + 1.2))
    ax = fig.subplots()
    names = [shown_label(r.label) for r in rows]
    labels = [n if len(n) < 48 else n[:45] + "..." for n in names]
    colors = ["tab:green" if is_kept(r.kept) else "tab:gray" for r in rows]
    ax.barh(labels[::-1], [r.tokens_per_s for r in rows][::-1], color=colors[::-1])
    for i, r in enumerate(rows[::-1]):
        ax.text(r.tokens_per_s, i, f" {r.speedup:.2f}x", va="center", fontsize=8)
    ax.set_xlabel(tr("tokens/s (median)"))
    ax.set_title(title or tr("the capstone's levers: green = kept"))
    fig.tight_layout()
    return fig


def same_losses(a: list[float], b: list[float], *, rtol: float, atol: float) -> float:
    """Assert two loss curves agree within tolerance; return the largest difference (chapter 7)."""
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=rtol, atol=atol)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """The kernel scaled_dot_product_attention ran for these inputs, read off the profiler (chapter 7)."""
    with without_profiler_markers(), profile(activities=[ProfilerActivity.CPU]) as prof:
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
        ("flash_attention_for_cpu", tr_mark("flash (CPU kernel)")),
        ("cudnn_attention", "cuDNN"),
        ("flash_attention", "flash"),
        ("efficient_attention", tr_mark("memory-efficient")),
        ("math", tr_mark("math (the unfused reference)")),
    ):
        if any(key in n for n in op_names):
            return tr(name)
    return tr("math (the unfused reference)") if op_names == [] else ", ".join(op_names)


def run_or_reason(fn: Callable[[], Any]) -> tuple[Any, str]:
    """(fn(), '') or (None, the first line of why it failed): a lever that fails is dropped, not fatal (chapter 7)."""
    try:
        return fn(), ""
    except (
        Exception
    ) as exc:  # a compiler missing, a kernel missing: the lever is dropped with the reason
        return None, f"{type(exc).__name__}: {first_line(exc)}"


@dataclass(frozen=True)
class RecipeFigure:
    """A public recipe's measured throughput, with where, when and at what shape it was measured (chapter 7)."""

    tokens_per_s: float
    mfu: float
    gpu: str
    shape: tuple[int, int, int, int, int, int]  # layers, heads, width, seq_len, batch, vocabulary
    source: str

    def __str__(self) -> str:
        layers, heads, width, seq_len, batch, vocab = self.shape
        return tr(
            "{tokens_per_s:,.0f} tokens/s, {mfu:.1%} MFU (bf16 datasheet): {source}, "
            "{layers} x {width}, {heads} heads, T = {seq_len}, batch {batch}, vocabulary {vocab}"
        ).format(
            tokens_per_s=self.tokens_per_s, mfu=self.mfu, source=tr(self.source) if self.source else "",
            layers=layers,
            width=width, heads=heads, seq_len=seq_len, batch=batch, vocab=vocab,
        )  # fmt: skip


#: nanoGPT's model.py trained its way (bf16 autocast, fused AdamW, torch.compile, TF32,
#: resident batches) at the capstone's big shape: AUDIT finding 26 of that run.
NANOGPT_H100 = RecipeFigure(
    572_379,
    0.362,
    "NVIDIA H100 80GB HBM3",
    (12, 12, 768, 1024, 16, 256),
    tr_mark(
        "nanoGPT's model.py on the course's H100 run of 2026-11-26 (torch 2.11, one benchmark at "
        "a time, 5 rounds of 10 steps, median)"
    ),
)


def recipe_ratio(
    device: str | torch.device,
    cfg: GPTConfig,
    batch_size: int,
    tokens_per_s: float,
    recipe: RecipeFigure = NANOGPT_H100,
) -> str:
    """This run's tokens/s as a ratio to the public recipe's, where its GPU class and shape apply; else why not (chapter 7)."""
    device = resolve_device(device)
    shape = (cfg.n_layer, cfg.n_head, cfg.d_model, cfg.seq_len, batch_size, cfg.vocab_size)
    if shape != recipe.shape:
        return tr(
            "the public recipe's figure does not apply here: it was measured at {recipe_shape} "
            "(layers, heads, width, seq_len, batch, vocabulary), this run is {shape}"
        ).format(recipe_shape=recipe.shape, shape=shape)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    row, ref = peak_row(name), peak_row(recipe.gpu)
    if row is None or ref is None or row.tflops.get("bf16") != ref.tflops.get("bf16"):
        return tr(
            "the public recipe's figure does not apply here: it was measured on an {gpu}, "
            "this is {name}"
        ).format(gpu=recipe.gpu, name=name)
    ratio = tokens_per_s / recipe.tokens_per_s
    same = row.pattern == ref.pattern
    indicative = tr("({name} has the H100 SXM's bf16 peak but other memory: indicative)")
    note = "" if same else " " + indicative.format(name=name)
    return tr(
        "final vs the public recipe: {ratio:.2f}x ({mine:,.0f} vs {recipe:,.0f} tokens/s){note}"
    ).format(ratio=ratio, mine=tokens_per_s, recipe=recipe.tokens_per_s, note=note)
