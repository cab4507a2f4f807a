"""Choosing the autocast dtype by hardware, and probes that a choice really runs here (chapter 3)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from helpers.devices import BF16_CAPABILITY, describe_device, resolve_device
from helpers.dtypes import dtype_name
from helpers.formats import PrecisionError, parse_precision
from helpers.i18n import tr
from helpers.units import Printed
from helpers.validate import first_line

#: CPU feature flags (as in /proc/cpuinfo) that mean bf16 / fp16 arithmetic in hardware.
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CPU_FP16_FLAGS = ("avx512_fp16", "amx_fp16")


@dataclass(frozen=True)
class AmpChoice(Printed):
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
        return tr("{name}{scaler}: {reason}").format(
            name=self.name, scaler=scaler, reason=self.reason
        )


def _described(desc: Any) -> dict[str, Any]:
    """A device description (a mapping or a DeviceInfo) as a dict, its kind and capability checked (chapter 3)."""
    d = dict(desc) if isinstance(desc, Mapping) else dict(vars(desc))
    kind = d.get("kind")
    if not isinstance(kind, str) or not kind.strip():
        raise PrecisionError(
            tr(
                "A device description needs a 'kind' such as 'cuda', 'rocm', 'cpu' or 'mps' "
                "(a DeviceInfo from describe_device() has one); got {kind!r}."
            ).format(kind=kind)
        )
    d["kind"] = kind.strip().lower()
    if (cc := d.get("compute_capability")) is not None:
        try:
            major, minor = (int(v) for v in cc)
        except (TypeError, ValueError):
            raise PrecisionError(
                tr(
                    "compute_capability must be a (major, minor) pair such as (8, 0); got {cc!r}."
                ).format(cc=cc)
            ) from None
        d["compute_capability"] = (major, minor)
    if isinstance(d.get("cpu_flags"), str):
        d["cpu_flags"] = d["cpu_flags"].split()
    return d


def _cpu_has(d: dict[str, Any], flags: Sequence[str]) -> bool | None:
    """Whether a description's cpu_flags include any of `flags`; None if it lists none (chapter 3)."""
    listed = d.get("cpu_flags")
    return None if listed is None else any(f in set(listed) for f in flags)


def bf16_is_native(desc: Any) -> bool:
    """Whether a described device has bf16 arithmetic in hardware, not by emulation (chapter 3)."""
    d = _described(desc)
    kind, cc = d["kind"], d.get("compute_capability")
    if kind == "cuda":
        return cc is not None and cc >= BF16_CAPABILITY  # not "bf16 reported": a T4 emulates it
    if kind == "cpu":
        flags = _cpu_has(d, CPU_BF16_FLAGS)
        return bool(d.get("bf16_native")) if flags is None else flags
    if kind == "rocm":
        native = d.get("bf16_native")
        return bool(d.get("bf16_reported") if native is None else native)
    return kind == "xpu" or bool(d.get("bf16_native"))


def _pick(dtype: torch.dtype, reason: str) -> AmpChoice:
    """An AmpChoice: fp16, and only fp16, needs a GradScaler (chapter 3)."""
    return AmpChoice(dtype, dtype == torch.float16, reason)


def _auto_choice(desc: dict[str, Any]) -> AmpChoice:
    """The recommended precision for a device description checked by _described (chapter 3)."""
    kind, cc, name = desc["kind"], desc.get("compute_capability"), desc.get("name") or ""
    bf16, fp16 = torch.bfloat16, torch.float16
    if kind == "cuda":
        if cc is None:
            raise PrecisionError(
                tr(
                    "A CUDA description needs compute_capability, e.g. (7, 5) for a T4 or (8, 0) "
                    "for an A100: that is what decides bf16 vs fp16."
                )
            )
        where = tr("compute capability {major}.{minor}").format(major=cc[0], minor=cc[1])
        if bf16_is_native(desc):
            need = "{}.{}".format(*BF16_CAPABILITY)
            return _pick(
                bf16,
                tr("{where} >= {need}: bf16 tensor cores, fp32's range, no scaler").format(
                    where=where, need=need
                ),
            )
        if cc >= (7, 0):
            return _pick(
                fp16,
                tr(
                    "{where}: fp16 tensor cores but no bf16 ones (torch may *report* bf16 "
                    "because it can emulate it, slowly); fp16 needs a GradScaler"
                ).format(where=where),
            )
        return _pick(
            torch.float32,
            tr(
                "{where} < 7.0: no tensor cores, so AMP saves memory at best and fp16 math can "
                "be slower than fp32; measure before switching it on"
            ).format(where=where),
        )
    if kind == "cpu":
        if bf16_is_native(desc):
            return _pick(
                bf16, tr("this CPU has bf16 instructions (AVX512-BF16 or AMX): bf16 autocast")
            )
        return _pick(
            torch.float32,
            tr(
                "this CPU has no bf16 units: bf16 autocast is emulated and was measured at 0.22x "
                "fp32 speed on such a CPU, fp16 slower still; keep fp32"
            ),
        )
    if kind == "rocm":
        if bf16_is_native(desc):
            return _pick(
                bf16,
                tr("AMD GPU{name} with bf16: bf16 autocast, no scaler").format(
                    name=" " + name if name else ""
                ),
            )
        return _pick(fp16, tr("AMD GPU without bf16: fp16 autocast with a GradScaler"))
    if kind == "mps":
        return _pick(
            fp16,
            tr(
                "Apple GPU: fp16 runs natively on every M-series chip; fp16 needs a GradScaler "
                "(GradScaler on MPS needs a recent torch)"
            ),
        )
    if kind == "xpu":
        return _pick(bf16, tr("Intel GPU: bf16 in hardware (XMX), no scaler"))
    return _pick(
        torch.float32, tr("no AMP rule for device kind {kind!r}: keep fp32").format(kind=kind)
    )


def choose_amp_dtype(
    desc: Any, prefer: str | torch.dtype = "auto", allow_slow: bool = False
) -> AmpChoice:
    """bf16 where native, fp16 + GradScaler where only fp16 is fast, else fp32; check a `prefer`red one (chapter 3)."""
    desc = _described(desc)
    auto = _auto_choice(desc)
    if isinstance(prefer, str) and prefer.strip().lower() == "auto":
        return auto
    dtype = parse_precision(prefer)
    if dtype == torch.float32:
        return AmpChoice(torch.float32, False, tr("fp32 requested: AMP off"))
    kind = desc["kind"]
    if not torch.amp.is_autocast_available("cuda" if kind == "rocm" else kind):
        raise PrecisionError(
            tr(
                "{dtype} cannot run on a {kind!r} device: torch has no autocast for it. "
                "Use 'fp32', or a cpu / cuda / mps / xpu device."
            ).format(dtype=dtype_name(dtype), kind=kind)
        )
    if kind == "mps" and dtype == torch.bfloat16 and not desc.get("bf16_native"):
        raise PrecisionError(
            tr(
                "bf16 cannot run on this MPS device (it needs macOS 14 or newer). "
                "Use 'fp16' with a GradScaler."
            )
        )
    slow = None
    if dtype == torch.bfloat16 and not bf16_is_native(desc) and kind in ("cuda", "cpu"):
        if kind == "cuda":
            slow = tr(
                "this GPU has no bf16 units, so bf16 is emulated (torch may still report it as "
                "supported)"
            )
        else:
            slow = tr(
                "this CPU has no bf16 units, so bf16 is emulated (torch may still report it as "
                "supported)"
            )
    if dtype == torch.float16 and kind == "cpu" and not _cpu_has(desc, CPU_FP16_FLAGS):
        slow = tr(
            "fp16 autocast on a CPU without AVX512-FP16/AMX-FP16 runs through slow fallback "
            "kernels (chapter 3's last table measures how slow on this CPU)"
        )
    if slow is not None and not allow_slow:
        better = (
            tr("{name} with a GradScaler").format(name=auto.name) if auto.use_scaler else auto.name
        )
        raise PrecisionError(
            tr(
                "{dtype} cannot run at a useful speed here: {slow}. Use {better} instead, or "
                "pass allow_slow=True to run it anyway (e.g. for a tiny demo)."
            ).format(dtype=dtype_name(dtype), slow=slow, better=better)
        )
    why = tr("requested, although {slow}").format(slow=slow) if slow else tr("requested")
    return _pick(dtype, why + (tr("; fp16 needs a GradScaler") if dtype == torch.float16 else ""))


def check_autocast(device: str | torch.device, dtype: str | torch.dtype) -> torch.dtype:
    """Run a tiny Linear forward+backward under autocast on `device`; raise PrecisionError if it cannot (chapter 3)."""
    dtype = parse_precision(dtype)
    device = resolve_device(device)
    if dtype == torch.float32:
        return dtype
    if not torch.amp.is_autocast_available(device.type):
        raise PrecisionError(
            tr("torch has no autocast for {kind!r} devices: use 'fp32' there.").format(
                kind=device.type
            )
        )
    layer = nn.Linear(4, 4).to(device)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autocast(device.type, dtype=dtype):
                out = layer(torch.ones(2, 4, device=device))
            out.float().sum().backward()
    except (RuntimeError, TypeError) as exc:
        raise PrecisionError(
            tr(
                "{dtype} autocast cannot run on {device} ({error}). Use 'fp32' or another precision."
            ).format(dtype=dtype_name(dtype), device=device, error=first_line(exc))
        ) from None
    disabled = [str(w.message) for w in caught if "autocast" in str(w.message).lower()]
    if out.dtype != dtype:
        said = disabled[0].splitlines()[0] if disabled else ""
        why = " " + tr("torch said: {message}").format(message=said) if disabled else ""
        raise PrecisionError(
            tr(
                "{dtype} autocast cannot run on {device}: a Linear came out as {got}, so "
                "autocast switched itself off.{why} Use 'fp32' or another precision."
            ).format(dtype=dtype_name(dtype), device=device, got=dtype_name(out.dtype), why=why)
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
                tr(
                    "fp16 needs a GradScaler, and torch.amp.GradScaler({kind!r}) does not work "
                    "with this torch {version}. Upgrade torch, or use 'bf16' / 'fp32'."
                ).format(kind=device.type, version=torch.__version__)
            )
        return _pick(
            torch.float32,
            tr(
                "fp16 would need a GradScaler, which this torch {version} lacks on {kind}; "
                "keep fp32 (or upgrade torch)"
            ).format(version=torch.__version__, kind=device.type),
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
        tr("Neither fp16 nor bf16 autocast runs on {device}: AMP is not available here.").format(
            device=device
        )
    )
