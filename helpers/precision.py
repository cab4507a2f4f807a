"""Number formats, choosing the autocast dtype by hardware, fp32-vs-AMP measurements (chapter 3).

The notebook shows ``torch.autocast`` and ``torch.amp.GradScaler`` in plain PyTorch; this
module holds what would clutter it: the ``torch.finfo`` table, the rule that picks bf16,
fp16 + GradScaler or plain fp32 from a device description, probes that check a choice really
runs here, and the sweep behind the chapter's precision x batch-size widget.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import nn

from helpers.devices import DeviceError, describe_device, dtype_name, parse_dtype, resolve_device
from helpers.matmul import tf32_available, tf32_matmuls
from helpers.memory import track_peak
from helpers.sweeps import SweepResult, run_sweep
from helpers.tables import format_table
from helpers.timing import benchmark
from helpers.validate import positive_int

#: The precisions a training step can run in: plain fp32 (AMP off) or autocast to bf16 / fp16.
PRECISIONS = ("fp32", "bf16", "fp16")
#: The sweep also takes "tf32": fp32 tensors, matmuls on TF32 tensor cores (NVIDIA 8.0+ only).
SWEEP_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")

#: CPU feature flags (as in /proc/cpuinfo) that mean bf16 / fp16 arithmetic in hardware.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CPU_FP16_FLAGS = ("avx512_fp16", "amx_fp16")


class PrecisionError(DeviceError):
    """A precision that is unknown, or that cannot run (usefully) on a device (chapter 3)."""


# --------------------------------------------------------------------------- formats


def format_bits(dtype: torch.dtype) -> tuple[int, int]:
    """(exponent bits, explicitly stored mantissa bits) of a floating dtype (chapter 3)."""
    info = torch.finfo(dtype)
    mantissa = round(-math.log2(info.eps))
    return info.bits - 1 - mantissa, mantissa


def fp8_dtypes() -> list[torch.dtype]:
    """The OCP fp8 formats (e4m3fn, e5m2) this torch has; empty on old builds (chapter 3)."""
    names = ("float8_e4m3fn", "float8_e5m2")
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


def _format_row(
    name: str, bits: int, exp: int, man: int, eps: float, mx: float, tiny: float
) -> dict[str, Any]:
    """One row of the format table (chapter 3)."""
    return {
        "format": name,
        "bits": bits,
        "exponent bits": exp,
        "mantissa bits": man,
        "eps": eps,
        "max": mx,
        "smallest normal": tiny,
        "smallest subnormal": tiny * eps,
    }


def finfo_rows(include_tf32: bool = True, include_fp8: bool = True) -> list[dict[str, Any]]:
    """torch.finfo of fp32, (tf32), fp16, bf16 (and fp8 where present), as table rows (chapter 3)."""
    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    if include_fp8:
        dtypes += fp8_dtypes()
    rows = []
    for dt in dtypes:
        info = torch.finfo(dt)
        exp, man = format_bits(dt)
        rows.append(
            _format_row(
                dtype_name(dt), info.bits, exp, man, info.eps, info.max, info.smallest_normal
            )
        )
    if include_tf32:
        # TF32 is not a storage dtype: tensor cores read fp32 and keep 10 mantissa bits.
        # Its numbers follow from the bit layout (8 exponent bits as fp32, 10 mantissa bits).
        eps = 2.0**-10
        tf32 = _format_row("tf32 (matmul only)", 19, 8, 10, eps, (2 - eps) * 2.0**127, 2.0**-126)
        rows.insert(1, tf32)
    return rows


def fp16_fate(value: float) -> str:
    """What casting `value` to fp16 does: 'zero', 'subnormal', 'normal' or 'inf' (chapter 3)."""
    x = torch.tensor(float(value), dtype=torch.float32).to(torch.float16).float().abs().item()
    if math.isinf(x):
        return "inf"
    if x == 0.0:
        return "zero"
    return "subnormal" if x < torch.finfo(torch.float16).smallest_normal else "normal"


# --------------------------------------------------------------------------- choosing a dtype


def parse_precision(name: str | torch.dtype) -> torch.dtype:
    """'fp32' / 'bf16' / 'fp16' (or an alias, or a torch dtype) -> dtype, with a clear error (chapter 3)."""
    try:
        dtype = parse_dtype(name)
    except DeviceError:
        raise PrecisionError(
            f"Unknown precision {name!r}. Use one of {', '.join(PRECISIONS)} "
            f"(aliases such as 'float16', 'bfloat16' and torch dtypes work too)."
        ) from None
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise PrecisionError(
            f"{dtype_name(dtype)} is not a mixed-precision choice: autocast lowers to bf16 or "
            f"fp16, and 'fp32' means AMP off. Use one of {', '.join(PRECISIONS)}."
        )
    return dtype


@dataclass(frozen=True)
class AmpChoice:
    """The autocast dtype for a device (fp32 = AMP off), whether fp16 needs a GradScaler, and why (chapter 3)."""

    dtype: torch.dtype
    use_scaler: bool
    reason: str

    @property
    def name(self) -> str:
        """'fp32', 'bf16' or 'fp16' (chapter 3)."""
        return dtype_name(self.dtype)

    @property
    def enabled(self) -> bool:
        """True when autocast should be on, i.e. the dtype is not fp32 (chapter 3)."""
        return self.dtype != torch.float32

    def __str__(self) -> str:
        scaler = " + GradScaler" if self.use_scaler else ""
        return f"{self.name}{scaler}: {self.reason}"

    def _repr_pretty_(self, p, cycle) -> None:  # noqa: ANN001 - IPython's printer protocol
        p.text(str(self))


def _field(desc: Any, key: str, default: Any = None) -> Any:
    """desc[key] for a mapping, desc.key for a DeviceInfo-like object (chapter 3)."""
    if isinstance(desc, Mapping):
        return desc.get(key, default)
    return getattr(desc, key, default)


def _kind(desc: Any) -> str:
    """The device kind of a description: 'cuda', 'rocm', 'cpu', 'mps', 'xpu', ... (chapter 3)."""
    kind = _field(desc, "kind")
    if not isinstance(kind, str) or not kind.strip():
        raise PrecisionError(
            "A device description needs a 'kind' such as 'cuda', 'rocm', 'cpu' or 'mps' "
            f"(a DeviceInfo from describe_device() has one); got {kind!r}."
        )
    return kind.strip().lower()


def _capability(desc: Any) -> tuple[int, int] | None:
    """compute_capability as a (major, minor) tuple, or None (chapter 3)."""
    cc = _field(desc, "compute_capability")
    if cc is None:
        return None
    try:
        major, minor = (int(v) for v in cc)
    except (TypeError, ValueError):
        raise PrecisionError(
            f"compute_capability must be a (major, minor) pair such as (8, 0); got {cc!r}."
        ) from None
    return major, minor


def _cpu_has(desc: Any, flags: Sequence[str]) -> bool | None:
    """Whether the description's cpu_flags include any of `flags`; None if it lists none (chapter 3)."""
    listed = _field(desc, "cpu_flags")
    if listed is None:
        return None
    if isinstance(listed, str):
        listed = listed.split()
    return any(f in set(listed) for f in flags)


def bf16_is_native(desc: Any) -> bool:
    """Whether a described device has bf16 arithmetic in hardware, not by emulation (chapter 3)."""
    kind = _kind(desc)
    if kind == "cuda":
        cc = _capability(desc)
        return cc is not None and cc >= (8, 0)  # never trust "bf16 reported": a T4 emulates it
    if kind == "cpu":
        flags = _cpu_has(desc, CPU_BF16_FLAGS)
        return bool(_field(desc, "bf16_native", False)) if flags is None else flags
    if kind == "rocm":
        native = _field(desc, "bf16_native")
        return bool(_field(desc, "bf16_reported", False) if native is None else native)
    if kind == "xpu":
        return True
    return bool(_field(desc, "bf16_native", False))


def _auto_choice(desc: Any) -> AmpChoice:
    """The recommended precision for a described device (chapter 3)."""
    kind, cc, name = _kind(desc), _capability(desc), _field(desc, "name", "") or ""
    bf16, fp16 = torch.bfloat16, torch.float16
    if kind == "cuda":
        if cc is None:
            raise PrecisionError(
                "A CUDA description needs compute_capability, e.g. (7, 5) for a T4 or (8, 0) "
                "for an A100: that is what decides bf16 vs fp16."
            )
        if cc >= (8, 0):
            return AmpChoice(
                bf16,
                False,
                f"compute capability {cc[0]}.{cc[1]} >= 8.0: bf16 tensor cores, fp32's range, no scaler",
            )
        if cc >= (7, 0):
            return AmpChoice(
                fp16,
                True,
                f"compute capability {cc[0]}.{cc[1]}: fp16 tensor cores but no bf16 ones "
                f"(torch may *report* bf16 because it can emulate it, slowly); fp16 needs a GradScaler",
            )
        return AmpChoice(
            torch.float32,
            False,
            f"compute capability {cc[0]}.{cc[1]} < 7.0: no tensor cores, so AMP saves memory at "
            f"best and fp16 math can be slower than fp32; measure before switching it on",
        )
    if kind == "cpu":
        if bf16_is_native(desc):
            return AmpChoice(
                bf16, False, "this CPU has bf16 instructions (AVX512-BF16 or AMX): bf16 autocast"
            )
        return AmpChoice(
            torch.float32,
            False,
            "this CPU has no bf16 units: bf16 autocast is emulated and was measured at 0.22x fp32 "
            "speed on such a CPU, fp16 slower still; keep fp32",
        )
    if kind == "rocm":
        if bf16_is_native(desc):
            return AmpChoice(
                bf16,
                False,
                f"AMD GPU{' ' + name if name else ''} with bf16: bf16 autocast, no scaler",
            )
        return AmpChoice(fp16, True, "AMD GPU without bf16: fp16 autocast with a GradScaler")
    if kind == "mps":
        return AmpChoice(
            fp16,
            True,
            "Apple GPU: fp16 runs natively on every M-series chip; fp16 needs a GradScaler "
            "(GradScaler on MPS needs a recent torch)",
        )
    if kind == "xpu":
        return AmpChoice(bf16, False, "Intel GPU: bf16 in hardware (XMX), no scaler")
    return AmpChoice(torch.float32, False, f"no AMP rule for device kind {kind!r}: keep fp32")


def _autocast_available(device_type: str) -> bool:
    """Whether this torch has autocast for a device type (chapter 3)."""
    check = getattr(torch.amp, "is_autocast_available", None)
    if check is None:
        return device_type in ("cpu", "cuda", "mps", "xpu", "hpu")
    return bool(check(device_type))


def choose_amp_dtype(
    desc: Any, prefer: str | torch.dtype = "auto", allow_slow: bool = False
) -> AmpChoice:
    """bf16 where native, fp16 + GradScaler where only fp16 is fast, else fp32; check a `prefer`red one (chapter 3)."""
    auto = _auto_choice(desc)
    if isinstance(prefer, str) and prefer.strip().lower() == "auto":
        return auto
    dtype = parse_precision(prefer)
    if dtype == torch.float32:
        return AmpChoice(torch.float32, False, "fp32 requested: AMP off")
    kind = _kind(desc)
    device_type = "cuda" if kind == "rocm" else kind
    if not _autocast_available(device_type):
        raise PrecisionError(
            f"{dtype_name(dtype)} cannot run on a {kind!r} device: torch has no autocast for it. "
            f"Use 'fp32', or a cpu / cuda / mps / xpu device."
        )
    if kind == "mps" and dtype == torch.bfloat16 and not _field(desc, "bf16_native", False):
        raise PrecisionError(
            "bf16 cannot run on this MPS device (it needs macOS 14 or newer). Use 'fp16' with a GradScaler."
        )
    slow = None
    if dtype == torch.bfloat16 and not bf16_is_native(desc) and kind in ("cuda", "cpu"):
        what = "this GPU" if kind == "cuda" else "this CPU"
        slow = f"{what} has no bf16 units, so bf16 is emulated (torch may still report it as supported)"
    if dtype == torch.float16 and kind == "cpu" and not _cpu_has(desc, CPU_FP16_FLAGS):
        slow = (
            "fp16 autocast on a CPU without AVX512-FP16/AMX-FP16 runs through slow fallback "
            "kernels (the course measured training steps 4-12x slower than fp32 on an AMD EPYC "
            "and 80x slower on a Xeon)"
        )
    if slow is not None and not allow_slow:
        better = auto.name + (" with a GradScaler" if auto.use_scaler else "")
        raise PrecisionError(
            f"{dtype_name(dtype)} cannot run at a useful speed here: {slow}. Use {better} "
            f"instead, or pass allow_slow=True to run it anyway (e.g. for a tiny demo)."
        )
    use_scaler = dtype == torch.float16
    why = "requested" + (f", although {slow}" if slow else "")
    return AmpChoice(dtype, use_scaler, why + ("; fp16 needs a GradScaler" if use_scaler else ""))


def check_autocast(device: str | torch.device, dtype: str | torch.dtype) -> torch.dtype:
    """Run a tiny Linear forward+backward under autocast on `device`; raise PrecisionError if it cannot (chapter 3)."""
    dtype = parse_precision(dtype)
    device = resolve_device(device)
    if dtype == torch.float32:
        return dtype
    if not _autocast_available(device.type):
        raise PrecisionError(
            f"torch has no autocast for {device.type!r} devices: use 'fp32' there."
        )
    layer = nn.Linear(4, 4).to(device)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast(device.type, dtype=dtype):
                out = layer(torch.ones(2, 4, device=device))
            out.float().sum().backward()
    except (RuntimeError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise PrecisionError(
            f"{dtype_name(dtype)} autocast cannot run on {device} ({first}). Use 'fp32' or another precision."
        ) from None
    disabled = [str(w.message) for w in caught if "autocast" in str(w.message).lower()]
    if out.dtype != dtype:
        why = f" torch said: {disabled[0].splitlines()[0]}" if disabled else ""
        raise PrecisionError(
            f"{dtype_name(dtype)} autocast cannot run on {device}: a Linear came out as "
            f"{dtype_name(out.dtype)}, so autocast switched itself off.{why} Use 'fp32' or another precision."
        )
    return dtype


def grad_scaler_works(device: str | torch.device) -> bool:
    """Whether torch.amp.GradScaler can scale, unscale and step on `device` (chapter 3)."""
    device = resolve_device(device)
    p = nn.Parameter(torch.ones(2, device=device))
    opt = torch.optim.SGD([p], lr=0.1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scaler = torch.amp.GradScaler(device.type)
            scaler.scale((p * 2).sum()).backward()
            scaler.step(opt)
            scaler.update()
        return scaler.is_enabled()
    except (RuntimeError, TypeError, AssertionError):
        return False


def local_cpu_flags() -> list[str]:
    """The bf16/fp16 feature flags of this machine's CPU, as torch detects them (chapter 3)."""
    probes = {
        "avx512_bf16": "_is_avx512_bf16_supported",
        "amx_bf16": "_is_amx_tile_supported",
        "amx_fp16": "_is_amx_fp16_supported",
    }
    return [flag for flag, probe in probes.items() if getattr(torch.cpu, probe, lambda: False)()]


def amp_for_device(
    device: str | torch.device | None = None,
    prefer: str | torch.dtype = "auto",
    allow_slow: bool = False,
) -> AmpChoice:
    """choose_amp_dtype(describe_device(device)), then checked by actually running it here (chapter 3)."""
    device = resolve_device(device)
    desc: Any = describe_device(device)
    if device.type == "cpu":
        desc = {"kind": "cpu", "name": desc.name, "cpu_flags": local_cpu_flags()}
    choice = choose_amp_dtype(desc, prefer=prefer, allow_slow=allow_slow)
    if not choice.enabled:
        return choice
    check_autocast(device, choice.dtype)
    if choice.use_scaler and not grad_scaler_works(device):
        if prefer != "auto":
            raise PrecisionError(
                f"fp16 needs a GradScaler, and torch.amp.GradScaler({device.type!r}) does not work "
                f"with this torch {torch.__version__}. Upgrade torch, or use 'bf16' / 'fp32'."
            )
        return AmpChoice(
            torch.float32,
            False,
            f"fp16 would need a GradScaler, which this torch {torch.__version__} lacks on "
            f"{device.type}; keep fp32 (or upgrade torch)",
        )
    return choice


def demo_dtype(device: str | torch.device, choice: AmpChoice) -> torch.dtype:
    """The 16-bit dtype for demos: the AMP choice, else bf16 on CPU, else one that runs here (chapter 3)."""
    device = resolve_device(device)
    if choice.enabled:
        return choice.dtype
    if device.type == "cpu":
        return torch.bfloat16
    order = [torch.float16, torch.bfloat16]
    if not grad_scaler_works(device):
        order.reverse()  # bf16 needs no scaler
    for dtype in order:
        try:
            return check_autocast(device, dtype)
        except PrecisionError:
            continue
    raise PrecisionError(
        f"Neither fp16 nor bf16 autocast runs on {device}: AMP is not available here."
    )


# --------------------------------------------------------------------------- measuring


def make_mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear layers of the given sizes with ReLU between them, e.g. (20, 64, 32, 1) (chapter 3)."""
    sizes = [positive_int(s, "every layer size") for s in sizes]
    if len(sizes) < 2:
        raise ValueError(f"make_mlp needs at least an input and an output size, got {sizes}.")
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def wide_mlp_sizes(width: int, depth: int = 4) -> tuple[int, ...]:
    """(width,) * (depth + 1) + (1,): a matmul-bound MLP of `depth` square layers (chapter 3)."""
    width, depth = positive_int(width, "width"), positive_int(depth, "depth")
    return (width,) * (depth + 1) + (1,)


def default_width(device: str | torch.device) -> int:
    """A matmul-bound but quick MLP width: 512 on CPU, 4096 on a GPU (chapter 3)."""
    return 512 if torch.device(device).type == "cpu" else 4096


def default_batch_sizes(device: str | torch.device) -> tuple[int, ...]:
    """Batch sizes for the default sweep: small on CPU, larger on a GPU (chapter 3)."""
    return (16, 128, 1024) if torch.device(device).type == "cpu" else (256, 1024, 4096)


def saved_activation_bytes(
    forward: Callable[[], torch.Tensor], exclude: Iterable[torch.Tensor] = ()
) -> tuple[int, torch.Tensor]:
    """Bytes of the tensors autograd saves for backward while `forward()` runs, parameters excluded (chapter 3)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    return sum(seen.values()), out


def memory_meter(device: str | torch.device) -> str:
    """What measure_amp_step's 'peak MiB' column means on this kind of device (chapter 3)."""
    kind = torch.device(device).type
    what = (
        "peak during one step over the memory held before it (parameters, optimizer state, batch)"
    )
    if kind == "cuda":
        return f"{what}: torch.cuda.max_memory_allocated, exact"
    if kind == "mps":
        return f"{what}: MPS allocated memory sampled every ms, approximate"
    if kind == "cpu":
        return f"{what}: every CPU allocation and free recorded by torch.profiler, exact"
    return f"not measured on {kind}: no peak meter for this device kind here"


#: What the 'saved MiB' column means: the same exact meter on every device.
SAVED_METER = (
    "bytes autograd saved for backward in one forward (activations and 16-bit weight copies); "
    "exact, the same meter on every device"
)


def _cpu_peak_bytes(fn: Callable[[], object]) -> int:
    """Peak of CPU allocations minus frees while fn() runs, from torch.profiler's memory events (chapter 3)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # The memory events themselves: the public events() list folds them into the ops.
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        if e.device_type() == torch.autograd.DeviceType.CPU:
            current += e.nbytes()  # > 0 for an allocation, < 0 for a free
            peak = max(peak, current)
    return peak


def step_peak_bytes(fn: Callable[[], object], device: str | torch.device) -> float:
    """Peak bytes allocated on `device` while fn() runs, over what was allocated before; memory_meter says how (chapter 3)."""
    device = resolve_device(device)
    if device.type in ("cuda", "mps"):
        with track_peak(device) as peak:
            fn()
        return float(peak.increase)
    if device.type == "cpu":
        return float(_cpu_peak_bytes(fn))
    fn()
    return math.nan


@dataclass
class _Step:
    """A model, a batch and one training step at one precision (chapter 3)."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    dtype: torch.dtype
    opt: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    device: torch.device

    def forward(self) -> torch.Tensor:
        """The loss under autocast (AMP off for fp32) (chapter 3)."""
        amp = self.dtype != torch.float32
        with torch.autocast(self.device.type, dtype=self.dtype if amp else None, enabled=amp):
            return nn.functional.mse_loss(self.model(self.x).float(), self.y)

    def __call__(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(self.forward()).backward()
        self.scaler.step(self.opt)
        self.scaler.update()


def _make_step(
    sizes: Sequence[int], batch_size: int, dtype: torch.dtype, device: torch.device, seed: int
) -> _Step:
    """Build the model, data, Adam and scaler for one measured configuration (chapter 3)."""
    torch.manual_seed(seed)
    model = make_mlp(sizes).to(device)
    x = torch.randn(batch_size, sizes[0], device=device)
    y = torch.randn(batch_size, sizes[-1], device=device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    return _Step(model, x, y, dtype, opt, scaler, device)


def _step_memory(step: _Step) -> tuple[float, int]:
    """(peak bytes of one step over what is held between steps, bytes saved for backward) (chapter 3)."""
    params = list(step.model.parameters())
    saved, loss = saved_activation_bytes(step.forward, exclude=params)
    del loss
    # The previous step's gradients live until the next zero_grad: drop them first, so that
    # "held before the step" is what a training loop holds between steps.
    step.opt.zero_grad(set_to_none=True)
    return step_peak_bytes(step, step.device), saved


def is_tf32(precision: str | torch.dtype) -> bool:
    """Whether a sweep precision names TF32 ('tf32', 'tensorfloat32'): fp32 with TF32 matmuls (chapter 3)."""
    return isinstance(precision, str) and precision.strip().lower() in ("tf32", "tensorfloat32")


def sweep_precisions(device: str | torch.device | None = None) -> list[str]:
    """fp32 (TF32 off), TF32 where it exists, and the device's AMP dtype: the sweep's rows (chapter 3)."""
    device = resolve_device(device)
    low = amp_for_device(device).dtype
    rows = ["fp32"] + ["tf32"] * tf32_available(device)
    return rows + ([dtype_name(low)] if low != torch.float32 else [])


def measure_amp_step(
    sizes: Sequence[int],
    batch_size: int,
    precision: str | torch.dtype = "fp32",
    device: str | torch.device | None = None,
    min_run_time: float = 0.2,
    seed: int = 0,
) -> dict[str, Any]:
    """Time one Adam training step of make_mlp(sizes) at a precision; throughput and memory (chapter 3)."""
    device = resolve_device(device)
    tf32 = is_tf32(precision)
    if tf32 and not tf32_available(device):
        raise PrecisionError(f"TF32 needs an NVIDIA GPU of compute capability 8.0+; not {device}.")
    dtype = torch.float32 if tf32 else check_autocast(device, precision)
    batch_size = positive_int(batch_size, "batch_size")
    step = _make_step(sizes, batch_size, dtype, device, seed)
    label = "tf32" if tf32 else dtype_name(dtype)
    with tf32_matmuls(tf32):  # "fp32" is true fp32 here, whatever the global setting
        timing = benchmark(step, device=device, warmup=2, min_run_time=min_run_time, label=label)
        peak, saved = _step_memory(step)
    return {
        "ms/step": timing.median * 1e3,
        "spread %": 100 * timing.spread,
        "samples/s": timing.rate(batch_size),
        "peak MiB": peak / 2**20,
        "saved MiB": saved / 2**20,
    }


@dataclass
class AmpSweep:
    """fp32-vs-AMP sweep results: one SweepResult per precision, plus what was skipped (chapter 3)."""

    device: str
    sizes: tuple[int, ...]
    meter: str
    results: dict[str, SweepResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """All rows, with the speed-up over fp32 at the same batch size where fp32 ran (chapter 3)."""
        base = {}
        if "fp32" in self.results:
            base = {r["batch size"]: r["samples/s"] for r in self.results["fp32"].rows}
        rows = []
        for precision, result in self.results.items():
            for r in result.rows:
                ref = base.get(r["batch size"])
                speedup = f"{r['samples/s'] / ref:.2f}x" if ref else "n/a"
                rows.append({"precision": precision, **r, "vs fp32": speedup})
        return rows

    def speedup(self, precision: str, batch_size: int) -> float:
        """samples/s of `precision` divided by fp32's at one batch size (chapter 3)."""

        def rate(p: str) -> float:
            if p not in self.results:
                raise KeyError(f"{p} was not measured; measured: {', '.join(self.results)}.")
            for r in self.results[p].rows:
                if r["batch size"] == batch_size:
                    return r["samples/s"]
            raise KeyError(f"batch size {batch_size} was not measured for {p}.")

        return rate(precision) / rate("fp32")

    def __str__(self) -> str:
        lines = [f"{self.device}, MLP {'-'.join(map(str, self.sizes))}", format_table(self.rows())]
        lines += [
            f"(stopped early for {p}: {r.stopped})" for p, r in self.results.items() if r.stopped
        ]
        lines += [f"skipped {p}: {why}" for p, why in self.skipped.items()]
        lines.append(f"peak MiB = {self.meter}")
        lines.append(f"saved MiB = {SAVED_METER}")
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:  # noqa: ANN001 - IPython's printer protocol
        p.text(str(self))


def run_amp_sweep(
    device: str | torch.device | None = None,
    precisions: Sequence[str] = ("fp32", "bf16"),
    batch_sizes: Sequence[int] | None = None,
    width: int | None = None,
    depth: int = 4,
    sizes: Sequence[int] | None = None,
    min_run_time: float = 0.2,
    allow_slow: bool = False,
    progress: bool = False,
) -> AmpSweep:
    """Measure a training step per precision x batch size; skip (and say why) what cannot run usefully (chapter 3)."""
    device = resolve_device(device)
    precisions = ["tf32" if is_tf32(p) else dtype_name(parse_precision(p)) for p in precisions]
    if not precisions:
        raise ValueError("Pick at least one precision: 'fp32', 'tf32', 'bf16' or 'fp16'.")
    batch_sizes = [
        positive_int(b, "batch size")
        for b in (default_batch_sizes(device) if batch_sizes is None else batch_sizes)
    ]
    if not batch_sizes:
        raise ValueError("Pick at least one batch size.")
    sizes = tuple(sizes) if sizes else wide_mlp_sizes(width or default_width(device), depth)
    sweep = AmpSweep(device=str(device), sizes=sizes, meter=memory_meter(device))
    for precision in dict.fromkeys(precisions):
        try:
            if precision == "tf32" and not tf32_available(device):
                raise PrecisionError(
                    f"TF32 exists only on NVIDIA GPUs of compute capability 8.0+ (Ampere and "
                    f"newer); {describe_device(device).name} has none"
                )
            if precision != "tf32":
                amp_for_device(device, prefer=precision, allow_slow=allow_slow)
        except PrecisionError as exc:
            sweep.skipped[precision] = str(exc)
            continue
        sweep.results[precision] = run_sweep(
            lambda b, p=precision: measure_amp_step(sizes, b, p, device, min_run_time),
            batch_sizes,
            param="batch size",
            progress=progress,
        )
    return sweep


def plot_amp_sweep(sweep: AmpSweep) -> Figure:
    """Throughput and memory against batch size, one line per precision (chapter 3)."""
    import matplotlib.pyplot as plt

    fig, (ax_rate, ax_mem) = plt.subplots(1, 2, figsize=(10, 3.8))
    for precision, result in sweep.results.items():
        if not result.rows:
            continue
        x = result.column("batch size")
        ax_rate.plot(x, result.column("samples/s"), marker="o", label=precision)
        line = ax_mem.plot(x, result.column("peak MiB"), marker="o", label=f"{precision} peak")
        ax_mem.plot(
            x,
            result.column("saved MiB"),
            marker="x",
            ls="--",
            color=line[0].get_color(),
            label=f"{precision} saved for backward",
        )
    for ax, ylabel in ((ax_rate, "samples / s (higher is better)"), (ax_mem, "MiB")):
        ax.set_xscale("log", base=2)
        ax.set(xlabel="batch size", ylabel=ylabel)
        ax.grid(True, alpha=0.3)
        if sweep.results:
            ax.legend()
    ax_rate.set_title(f"training step, MLP {'-'.join(map(str, sweep.sizes))}", fontsize=10)
    how = sweep.meter.rsplit(": ", 1)[-1]
    ax_mem.set_title(f"memory per step: peak ({how}) and saved for backward", fontsize=9)
    if sweep.skipped:
        fig.suptitle(
            "skipped: " + ", ".join(sweep.skipped) + " (see the printed reason)", fontsize=9
        )
    fig.tight_layout()
    return fig


def amp_controls(
    device: str | torch.device,
    precisions: Sequence[str] = ("fp32", "bf16"),
    allow_slow: bool = False,
) -> dict[str, Any]:
    """ipywidgets controls for run_amp_sweep: precisions, batch sizes, width, slow ones (chapter 3)."""
    import ipywidgets as widgets

    device = torch.device(device)
    batch_choices = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    widths = (256, 512, 1024, 2048, 4096, 8192)
    chosen = tuple("tf32" if is_tf32(p) else dtype_name(parse_precision(p)) for p in precisions)
    options = [p for p in SWEEP_PRECISIONS if p != "tf32" or tf32_available(device)]
    return {
        "precisions": widgets.SelectMultiple(
            options=options, value=chosen, description="precisions", rows=len(options)
        ),
        "batch_sizes": widgets.SelectMultiple(
            options=list(batch_choices),
            value=default_batch_sizes(device),
            description="batch sizes",
            rows=6,
        ),
        "width": widgets.Dropdown(
            options=list(widths), value=default_width(device), description="MLP width"
        ),
        "allow_slow": widgets.Checkbox(
            value=allow_slow,
            description="run slow/emulated ones too",
            style={"description_width": "initial"},
        ),
    }
