"""FP8 matmuls in training through torchao's float8 (an optional package), and FP8 peaks (chapter 7).

torchao's ``convert_to_float8_training`` swaps a model's ``nn.Linear`` layers for
``Float8Linear``: each matmul casts its inputs to float8 (e4m3 forward, e5m2 for gradients)
with a scale computed from the tensor's largest value, runs on the FP8 tensor cores of GPUs
of compute capability 8.9+ (Ada, Hopper, Blackwell), and keeps the weights in fp32 or bf16.
With ``emulate=True`` the same casts run on any device, in ordinary precision: the rounding
FP8 makes, without its speed.

torchao is optional (``pip install -e ".[fp8]"``); importing it takes seconds, so it is
imported only when a model is converted.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re

import torch
from torch import nn

from helpers.devices import resolve_device
from helpers.i18n import tr
from helpers.mfu import Peak

#: The torchao releases checked with this course (0.14.1, 0.16.0 and 0.18.0 installed and
#: trained a converted GPT, emulated, on torch 2.13's CPU build); pyproject's "fp8" extra.
TORCHAO_RANGE = ">=0.14,<0.19"
INSTALL_HINT = f"pip install 'torchao{TORCHAO_RANGE}' (or pip install -e '.[fp8]')"


def _install_hint() -> str:
    """INSTALL_HINT in the learner's language: the commands themselves stay as they are (chapter 7)."""
    return tr("pip install '{package}' (or pip install -e '.[fp8]')").format(
        package=f"torchao{TORCHAO_RANGE}"
    )


#: FP8 tensor cores start with Ada (8.9) and Hopper (9.0).
FP8_CAPABILITY = (8, 9)

#: Dense FP8 peak TFLOP/s (FP32 accumulate) of GPUs with FP8 tensor cores, keyed by a name
#: pattern matched against torch.cuda.get_device_name() (whitespace collapsed, first match
#: wins); datasheet figures "with sparsity" are halved. Each pattern is written like
#: helpers.peaks' row of the same GPU, and each figure is about twice that row's bf16 figure
#: (the L40S datasheet's are 1.2% apart): tests/test_fp8.py checks both.
FP8_DENSE_TFLOPS: dict[str, float] = {
    r"\bB200\b": 4500.0,  # NVIDIA HGX B200 datasheet: 72 PFLOPS sparse FP8 for 8 GPUs
    r"\bGB200\b": 5000.0,  # NVIDIA GB200 NVL72 datasheet, per GPU
    r"GeForce RTX 5090$": 419.0,  # RTX Blackwell whitepaper, FP32 accumulate: 838 sparse
    r"\bH100\b(?!.*\b(PCIe|NVL)\b)": 1979.0,  # NVIDIA H100 datasheet, SXM: 3,958 sparse
    r"\bH100\b.*\bPCIe\b": 1513.0,  # NVIDIA H100 datasheet, PCIe: 3,026 sparse
    r"\bH100 NVL\b": 1670.5,  # NVIDIA H100 NVL datasheet: 3,341 sparse
    r"\bH200\b(?!.*\bNVL\b)": 1979.0,  # NVIDIA H200 datasheet, SXM: 3,958 sparse
    r"\bH200 NVL\b": 1670.5,  # NVIDIA H200 datasheet, NVL: 3,341 sparse
    r"\bGH200\b": 1979.0,  # NVIDIA GH200 datasheet: 3,958 sparse
    r"\bH800\b(?!.*\bPCIe\b)": 1979.0,  # NVIDIA H800 datasheet, SXM
    r"\bH800\b.*\bPCIe\b": 1513.0,  # NVIDIA H800 datasheet, PCIe
    r"\bH20\b": 296.0,  # NVIDIA H20 product brief (dense)
    r"\bL40S\b": 733.0,  # NVIDIA L40S datasheet: 1,466 sparse
    r"\bL40\b": 362.0,  # NVIDIA L40 datasheet: 724 sparse
    r"\bL4\b": 242.5,  # NVIDIA L4 datasheet: 485 sparse
    r"\bRTX 6000 Ada\b": 728.5,  # Ada Lovelace whitepaper, FP32 accumulate
    r"GeForce RTX 4090$": 330.3,  # Ada Lovelace whitepaper, FP32 accumulate
}


def torchao_version() -> str | None:
    """The installed torchao's version, or None where it is not installed (chapter 7)."""
    if importlib.util.find_spec("torchao") is None:
        return None
    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:  # importable, but not installed by pip
        return "unknown"


def fp8_hardware(device: str | torch.device) -> tuple[bool, str]:
    """(has `device` FP8 tensor cores?, why not): an NVIDIA GPU of compute capability 8.9+ (chapter 7)."""
    device = resolve_device(device)
    if device.type != "cuda":
        return False, tr(
            "FP8 matmuls need an NVIDIA GPU with FP8 tensor cores (compute capability 8.9+: "
            "Ada, Hopper, Blackwell); this is {kind}"
        ).format(kind=device.type)
    if getattr(torch.version, "hip", None):
        return False, tr(
            "this course runs torchao's float8 training on NVIDIA GPUs only (AMD's MI300 "
            "has FP8 too, in the fnuz formats torchao handles separately)"
        )
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < FP8_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return False, tr(
            "{name} is compute capability {major}.{minor}: FP8 tensor cores start at 8.9 "
            "(Ada, Hopper)"
        ).format(name=name, major=major, minor=minor)
    return True, ""


def fp8_available(device: str | torch.device) -> tuple[bool, str]:
    """(can FP8 training run on `device` here?, why not): the hardware, then torchao (chapter 7)."""
    ok, why = fp8_hardware(device)
    if not ok:
        return ok, why
    if torchao_version() is None:
        return False, tr("torchao is not installed: {hint}").format(hint=_install_hint())
    return True, ""


def fp8_plan(device: str | torch.device) -> tuple[str, str]:
    """What chapter 7 does about FP8 here: ('native', '') with FP8 tensor cores and torchao; ('emulated', why) where only the rounding can run; ('none', why) (chapter 7)."""
    ok, why = fp8_hardware(device)
    have_torchao = torchao_version() is not None
    if ok and have_torchao:
        return "native", ""
    if ok:  # an FP8 GPU: measured for real, or not at all (emulating would hide a failure)
        return "none", tr("torchao is not installed: {hint}").format(hint=_install_hint())
    if torch.device(device).type == "mps":  # the emulation casts to float8 on the device
        return "none", tr("{why}; MPS has no float8 dtypes to emulate FP8's rounding with").format(
            why=why
        )
    if have_torchao:
        return "emulated", why
    return "none", tr("{why}; the emulated rounding needs torchao: {hint}").format(
        why=why, hint=_install_hint()
    )


def fp8_layer_filter(module: nn.Module, name: str) -> bool:
    """Which Linear layers get FP8: all but the head tied to the embedding, sizes multiple of 16 (chapter 7)."""
    if name == "head" or not isinstance(module, nn.Linear):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert_fp8(model: nn.Module, *, emulate: bool = False) -> nn.Module:
    """Swap `model`'s Linear layers (fp8_layer_filter) for torchao's Float8Linear, in place (chapter 7)."""
    if torchao_version() is None:
        raise ModuleNotFoundError(
            tr("FP8 training needs torchao, which is not installed: {hint}.").format(
                hint=_install_hint()
            )
        )
    # imported here, not at the top: an optional package whose import takes seconds
    float8 = importlib.import_module("torchao.float8")
    config = float8.Float8LinearConfig(emulate=emulate)
    return float8.convert_to_float8_training(
        model, module_filter_fn=fp8_layer_filter, config=config
    )


def fp8_layers(model: nn.Module) -> int:
    """How many of `model`'s layers run their matmuls in FP8 (torchao's Float8Linear) (chapter 7)."""
    return sum(type(m).__name__ == "Float8Linear" for m in model.modules())


def fp8_peak(device: str | torch.device) -> Peak | None:
    """The datasheet dense FP8 peak of this GPU, or None where no datasheet figure is known (chapter 7)."""
    device = resolve_device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    collapsed = " ".join(name.split())
    tflops = next(
        (t for p, t in FP8_DENSE_TFLOPS.items() if re.search(p, collapsed, re.IGNORECASE)), None
    )
    if tflops is None:
        return None
    return Peak(tflops * 1e12, tr("datasheet dense FP8 peak of {name}").format(name=name), False)
