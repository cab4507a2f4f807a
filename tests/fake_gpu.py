"""A stubbed GPU for CPU tests: torch reports a real GPU model, with no GPU and no driver.

Kernels cannot run on a fake device, but the Python around them can: everything that
decides, sizes, formats or reads properties. Use it through the ``fake_gpu`` fixture
(tests/conftest.py), a factory that patches with pytest's ``monkeypatch`` (undone after the
test)::

    def test_t4_gets_fp16(fake_gpu) -> None:
        gpu = fake_gpu("t4")                 # torch now sees one Tesla T4
        info = describe_device("cuda")       # DeviceInfo of the fake T4
        assert gpu.device == torch.device("cuda", 0)

``fake_gpu(kind="h100_sxm", *, count=1, name=None) -> FakeGpu``

- ``kind``: one of ``KINDS`` -- "h100_sxm", "a100", "t4", "rtx4090" (NVIDIA CUDA),
  "mi300x" (AMD ROCm: ``torch.version.hip`` set, ``torch.version.cuda`` None, NVML absent),
  "mps" (Apple: ``torch.backends.mps.is_available()`` True, CUDA absent, NVML absent).
- ``count``: how many identical GPUs torch sees (CUDA/ROCm kinds; MPS is always one).
- ``name``: report another ``torch.cuda.get_device_name()`` with the kind's other figures,
  e.g. ``fake_gpu("a100", name="NVIDIA A100-PCIE-40GB")`` (for the peak table).

What is patched (with the real figures of each GPU, see ``SPECS``):

- ``torch.cuda``: is_available, device_count, current_device, set_device,
  get_device_properties (a ``FakeDeviceProperties`` with the attribute names of torch's
  ``_CudaDeviceProperties``: name, major, minor, total_memory, multi_processor_count,
  gcnArchName, L2_cache_size, warp_size, ...), get_device_name, get_device_capability,
  is_bf16_supported(including_emulation=True) (a T4 says True with emulation, False
  without; ROCm always True, as torch does), synchronize, memory_allocated,
  memory_reserved, max_memory_allocated, max_memory_reserved, reset_peak_memory_stats,
  mem_get_info, empty_cache, and Event (``FakeEvent``: timed with the host clock, so
  ``helpers.timing.benchmark`` runs its CUDA-events path on CPU work).
- ``torch.version.cuda`` / ``torch.version.hip``; ``torch.backends.mps.is_available`` /
  ``is_built``; ``torch.xpu.is_available`` (False); ``torch.mps`` memory and synchronize for
  "mps".
- ``torch.accelerator`` where this torch has it: is_available, current_accelerator,
  device_count, current_device_index, synchronize, and the memory functions (also under
  ``torch.accelerator.memory``).
- ``sys.modules["pynvml"]``: a fake nvidia-ml-py (``FakeNvml``) with nvmlInit/nvmlShutdown
  (reference counted; a call while not initialised raises NVMLError_Uninitialized, as the real
  library does), nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetHandleByUUID
  (the UUIDs the fake's torch reports), nvmlDeviceGetName, nvmlDeviceGetMemoryInfo,
  nvmlDeviceGetUtilizationRates, nvmlDeviceGetTemperature, nvmlDeviceGetPowerUsage,
  nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetClockInfo (the SM clock),
  nvmlDeviceGetCurrentClocksEventReasons and its older name
  nvmlDeviceGetCurrentClocksThrottleReasons (instance attributes: delete one to test a
  fallback), nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetCudaComputeCapability,
  nvmlSystemGetDriverVersion and the real exception classes. For "mi300x" and "mps" nvmlInit raises
  NVMLError_LibraryNotFound, as it does without an NVIDIA driver.

The returned ``FakeGpu`` is the state the fakes read and write; tests may set it:

- ``gpu.device`` (``cuda:0`` or ``mps``), ``gpu.spec`` (a ``GpuSpec``), ``gpu.count``;
- ``gpu.allocated`` / ``gpu.reserved`` / ``gpu.peak_allocated`` / ``gpu.peak_reserved`` (bytes,
  what the memory functions return; ``gpu.allocate(n)`` / ``gpu.free(n)`` move them as the
  caching allocator would);
- ``gpu.synchronize_calls``; ``gpu.nvml`` (the fake module: ``utilization``,
  ``memory_used``, ``temperature_c``, ``power_mw``, ``power_limit_mw`` (``POWER_LIMIT_MW``),
  ``sm_clock_mhz``, ``clock_event_reasons`` (the bit mask the clock-event reasons return),
  ``processes`` (GPU index -> list of (pid, used bytes), what
  nvmlDeviceGetComputeRunningProcesses returns), ``unsupported`` (a set of reading names that
  raise NVMLError_NotSupported: "memory", "utilization", "temperature", "power", "clock",
  "reasons", "processes"), ``init_count``).

Anything that launches a kernel (``torch.ones(..., device="cuda")``) still fails: that is the
line between what CPU tests can check and what needs a real GPU (tests/gpu_only_lines.md).
"""

from __future__ import annotations

import time
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

MiB = 2**20
GiB = 2**30


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model as torch and NVML report it on a real machine."""

    key: str
    name: str
    backend: str  # "cuda" (NVIDIA), "rocm" (AMD through torch.cuda) or "mps" (Apple)
    major: int = 0
    minor: int = 0
    multi_processor_count: int = 0
    total_memory: int = 0  # what torch's total_memory says (a little under the marketing size)
    nvml_total: int | None = None  # what NVML's memory total says (NVIDIA only)
    L2_cache_size: int = 0
    gcnArchName: str = "NVIDIA"
    warp_size: int = 32
    max_threads_per_multi_processor: int = 2048
    clock_rate: int = 0  # kHz
    memory_clock_rate: int = 0  # kHz
    memory_bus_width: int = 0  # bits
    shared_memory_per_block: int = 48 * 1024
    shared_memory_per_multiprocessor: int = 0
    idle_power_mw: int = 0


#: The GPUs the fixture knows, by kind. Figures: NVIDIA/AMD datasheets for SM/CU counts and
#: capabilities; total_memory as torch prints it on these cards (H100: 79.18 GiB, as measured
#: in /work/shared/gpu-runs/h100-2026-11-23; NVML's total there was 79.65 GiB).
SPECS: dict[str, GpuSpec] = {
    "h100_sxm": GpuSpec(
        key="h100_sxm",
        name="NVIDIA H100 80GB HBM3",
        backend="cuda",
        major=9,
        minor=0,
        multi_processor_count=132,
        total_memory=81_079 * MiB,
        nvml_total=81_559 * MiB,
        L2_cache_size=50 * MiB,
        clock_rate=1_980_000,
        memory_clock_rate=2_619_000,
        memory_bus_width=5120,
        shared_memory_per_multiprocessor=228 * 1024,
        idle_power_mw=117_000,
    ),
    "a100": GpuSpec(
        key="a100",
        name="NVIDIA A100-SXM4-80GB",
        backend="cuda",
        major=8,
        minor=0,
        multi_processor_count=108,
        total_memory=81_050 * MiB,
        nvml_total=81_920 * MiB,
        L2_cache_size=40 * MiB,
        clock_rate=1_410_000,
        memory_clock_rate=1_593_000,
        memory_bus_width=5120,
        shared_memory_per_multiprocessor=164 * 1024,
        idle_power_mw=62_000,
    ),
    "t4": GpuSpec(
        key="t4",
        name="Tesla T4",
        backend="cuda",
        major=7,
        minor=5,
        multi_processor_count=40,
        total_memory=15_095 * MiB,
        nvml_total=15_360 * MiB,
        L2_cache_size=4 * MiB,
        max_threads_per_multi_processor=1024,
        clock_rate=1_590_000,
        memory_clock_rate=5_001_000,
        memory_bus_width=256,
        shared_memory_per_multiprocessor=64 * 1024,
        idle_power_mw=9_000,
    ),
    "rtx4090": GpuSpec(
        key="rtx4090",
        name="NVIDIA GeForce RTX 4090",
        backend="cuda",
        major=8,
        minor=9,
        multi_processor_count=128,
        total_memory=24_209 * MiB,
        nvml_total=24_564 * MiB,
        L2_cache_size=72 * MiB,
        max_threads_per_multi_processor=1536,
        clock_rate=2_520_000,
        memory_clock_rate=10_501_000,
        memory_bus_width=384,
        shared_memory_per_multiprocessor=100 * 1024,
        idle_power_mw=21_000,
    ),
    "mi300x": GpuSpec(
        key="mi300x",
        name="AMD Instinct MI300X",
        backend="rocm",
        major=9,
        minor=4,
        multi_processor_count=304,
        total_memory=196_592 * MiB,
        L2_cache_size=4 * MiB,
        gcnArchName="gfx942:sramecc+:xnack-",
        warp_size=64,
        clock_rate=2_100_000,
        memory_clock_rate=1_300_000,
        memory_bus_width=8192,
        shared_memory_per_block=64 * 1024,
        shared_memory_per_multiprocessor=64 * 1024,
    ),
    "mps": GpuSpec(
        key="mps",
        name="Apple M2 Pro",
        backend="mps",
        total_memory=21_845 * MiB,  # torch.mps.recommended_max_memory() of a 32 GB Mac
    ),
}

#: The kinds fake_gpu accepts.
KINDS: tuple[str, ...] = tuple(SPECS)

#: torch.version strings of the fake builds.
CUDA_VERSION = "12.8"
HIP_VERSION = "6.4.43482-0f2d60242"


@dataclass
class FakeDeviceProperties:
    """What torch.cuda.get_device_properties returns, with _CudaDeviceProperties' attribute names."""

    name: str
    major: int
    minor: int
    multi_processor_count: int
    total_memory: int
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    max_threads_per_multi_processor: int = 2048
    gcnArchName: str = "NVIDIA"
    warp_size: int = 32
    uuid: str = "00000000-0000-0000-0000-000000000000"
    L2_cache_size: int = 0
    clock_rate: int = 0
    memory_clock_rate: int = 0
    memory_bus_width: int = 0
    shared_memory_per_block: int = 48 * 1024
    shared_memory_per_multiprocessor: int = 0

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"gcnArchName='{self.gcnArchName}', total_memory={self.total_memory // MiB}MB, "
            f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid}, "
            f"L2_cache_size={self.L2_cache_size // MiB}MB)"
        )


def _nvml_errors() -> dict[str, type[Exception]]:
    """The real nvidia-ml-py exception classes, so `except pynvml.NVMLError` works as in real code."""
    try:
        import pynvml as real
    except ImportError:  # pragma: no cover - nvidia-ml-py is in requirements.txt

        class NVMLError(Exception):
            pass

        return {
            "NVMLError": NVMLError,
            "NVMLError_LibraryNotFound": type("NVMLError_LibraryNotFound", (NVMLError,), {}),
            "NVMLError_Uninitialized": type("NVMLError_Uninitialized", (NVMLError,), {}),
            "NVMLError_NotSupported": type("NVMLError_NotSupported", (NVMLError,), {}),
            "NVMLError_InvalidArgument": type("NVMLError_InvalidArgument", (NVMLError,), {}),
        }
    return {
        name: getattr(real, name)
        for name in (
            "NVMLError",
            "NVMLError_LibraryNotFound",
            "NVMLError_Uninitialized",
            "NVMLError_NotSupported",
            "NVMLError_InvalidArgument",
        )
    }


#: Board power limits (mW) nvmlDeviceGetEnforcedPowerLimit reports, from each board's datasheet.
POWER_LIMIT_MW = {"h100_sxm": 700_000, "a100": 400_000, "t4": 70_000, "rtx4090": 450_000}


class FakeNvml(types.ModuleType):
    """A stand-in for the `pynvml` module of nvidia-ml-py, answering for the fake GPUs."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def __init__(self, gpu: FakeGpu) -> None:
        super().__init__("pynvml")
        for name, cls in _nvml_errors().items():
            setattr(self, name, cls)
        self._gpu = gpu
        self.driver_present = gpu.spec.backend == "cuda"
        self.init_count = 0
        self.init_calls = 0
        self.utilization = 0
        self.memory_used = 512 * MiB
        self.temperature_c = 34
        self.sm_clock_mhz = 1755
        self.power_mw = gpu.spec.idle_power_mw
        self.unsupported: set[str] = set()
        #: (pid, used bytes) of each compute process on each GPU index, as
        #: nvmlDeviceGetComputeRunningProcesses lists them (a pid from the host's namespace).
        self.processes: dict[int, list[tuple[int, int | None]]] = {}
        #: The bit mask nvmlDeviceGetCurrentClocksEventReasons returns (nvml.h: 0x1 GPU idle,
        #: 0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal, 0x80 power brake).
        self.clock_event_reasons = 0
        self.power_limit_mw = POWER_LIMIT_MW.get(gpu.spec.key, 0)
        # Instance attributes, so a test can delete the newer name (as nvidia-ml-py < 12.535
        # lacks it) and see code fall back to the older one.
        self.nvmlDeviceGetCurrentClocksEventReasons = self._clocks_event_reasons
        self.nvmlDeviceGetCurrentClocksThrottleReasons = self._clocks_event_reasons

    # -- library lifetime --------------------------------------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802 - NVML's names
        self.init_calls += 1
        if not self.driver_present:
            raise self.NVMLError_LibraryNotFound()
        self.init_count += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._need_init()
        self.init_count -= 1

    def _need_init(self) -> None:
        if self.init_count <= 0:
            raise self.NVMLError_Uninitialized()

    def _reading(self, what: str) -> None:
        self._need_init()
        if what in self.unsupported:
            raise self.NVMLError_NotSupported()

    # -- queries -----------------------------------------------------------------------------
    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._need_init()
        return "580.95.05"

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._need_init()
        return self._gpu.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        self._need_init()
        if not 0 <= index < self._gpu.count:
            raise self.NVMLError_InvalidArgument()
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:  # noqa: N802
        self._need_init()
        for index in range(self._gpu.count):  # the fake's torch reports these UUIDs
            if uuid == f"GPU-{self._gpu.spec.key}-{index:04d}":
                return index
        raise self.NVMLError_InvalidArgument()

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:  # noqa: N802
        self._reading("clock")
        return self.sm_clock_mhz

    def _clocks_event_reasons(self, handle: int) -> int:
        self._reading("reasons")
        return self.clock_event_reasons

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:  # noqa: N802
        self._reading("power")
        return self.power_limit_mw

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        self._need_init()
        return self._gpu.name

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:  # noqa: N802
        self._reading("memory")
        total = self._gpu.spec.nvml_total or self._gpu.spec.total_memory
        return types.SimpleNamespace(
            total=total, used=self.memory_used, free=total - self.memory_used
        )

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> types.SimpleNamespace:  # noqa: N802
        self._reading("utilization")
        return types.SimpleNamespace(gpu=self.utilization, memory=self.utilization // 2)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:  # noqa: N802
        self._reading("temperature")
        return self.temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:  # noqa: N802
        self._reading("power")
        return self.power_mw

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[types.SimpleNamespace]:  # noqa: N802
        self._reading("processes")
        return [
            types.SimpleNamespace(pid=pid, usedGpuMemory=used)
            for pid, used in self.processes.get(handle, [])
        ]

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:  # noqa: N802
        self._need_init()
        return (self._gpu.spec.major, self._gpu.spec.minor)


@dataclass
class FakeGpu:
    """The state behind one fake_gpu(...) call: what the patched functions read and write."""

    spec: GpuSpec
    count: int = 1
    name: str = ""
    current: int = 0
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    synchronize_calls: int = 0
    #: The current device at each torch.cuda.Event.record(): a real event goes on that GPU's stream.
    event_devices: list[int] = field(default_factory=list)
    nvml: FakeNvml = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.name = self.name or self.spec.name
        self.nvml = FakeNvml(self)

    @property
    def device(self) -> torch.device:
        """The device string tests pass to the helpers: cuda:0, or mps."""
        return torch.device("mps") if self.spec.backend == "mps" else torch.device("cuda", 0)

    def allocate(self, n: int) -> None:
        """Pretend the caching allocator handed out n bytes (reserving more if needed)."""
        self.allocated += n
        self.reserved = max(self.reserved, self.allocated)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, n: int) -> None:
        """Pretend n bytes of tensors died (the allocator keeps them reserved)."""
        self.allocated = max(0, self.allocated - n)

    # -- helpers for the patched functions ---------------------------------------------------
    def index(self, device: Any = None) -> int:
        """The GPU index a torch.cuda function was asked about; IndexError-like if absent."""
        if device is None:
            return self.current
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type not in ("cuda",):
                raise ValueError(f"Expected a cuda device, but got: {device}")
            index = self.current if device.index is None else device.index
        else:
            index = int(device)
        if not 0 <= index < self.count:
            raise AssertionError("Invalid device id")  # what torch.cuda raises
        return index

    def properties(self, device: Any = None) -> FakeDeviceProperties:
        """torch.cuda.get_device_properties of the fake."""
        self.index(device)
        s = self.spec
        return FakeDeviceProperties(
            name=self.name,
            major=s.major,
            minor=s.minor,
            multi_processor_count=s.multi_processor_count,
            total_memory=s.total_memory,
            max_threads_per_multi_processor=s.max_threads_per_multi_processor,
            gcnArchName=s.gcnArchName,
            warp_size=s.warp_size,
            uuid=f"GPU-{s.key}-{self.index(device):04d}",
            L2_cache_size=s.L2_cache_size,
            clock_rate=s.clock_rate,
            memory_clock_rate=s.memory_clock_rate,
            memory_bus_width=s.memory_bus_width,
            shared_memory_per_block=s.shared_memory_per_block,
            shared_memory_per_multiprocessor=s.shared_memory_per_multiprocessor,
        )

    def bf16_supported(self, including_emulation: bool = True) -> bool:
        """torch.cuda.is_bf16_supported as torch computes it (ROCm: always; CUDA: sm80+ or emulated)."""
        if self.spec.backend == "rocm":
            return True
        return self.spec.major >= 8 or bool(including_emulation)

    def synchronize(self, device: Any = None) -> None:
        """torch.cuda.synchronize / torch.accelerator.synchronize: count the call."""
        if device is not None and self.spec.backend != "mps":
            self.index(device)
        self.synchronize_calls += 1

    def reset_peak(self, device: Any = None) -> None:
        """torch.cuda.reset_peak_memory_stats: peaks drop to the current values."""
        self.index(device)
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache: give back what no tensor uses."""
        self.reserved = self.allocated

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        """torch.cuda.mem_get_info: (free, total) bytes of the whole GPU."""
        self.index(device)
        context = 500 * MiB  # the CUDA context and other processes
        total = self.spec.total_memory
        return total - self.reserved - context, total


class FakeEvent:
    """torch.cuda.Event on the host clock: record() notes time.perf_counter(), elapsed_time in ms."""

    #: The fake GPU whose current device a record() notes (set by install()).
    gpu: FakeGpu | None = None

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ):
        self.enable_timing = enable_timing
        self.time: float | None = None

    def record(self, stream: Any = None) -> None:
        self.time = time.perf_counter()
        if self.gpu is not None:
            self.gpu.event_devices.append(self.gpu.current)

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: FakeEvent) -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.time is None or end.time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.time - self.time) * 1e3


class FakeCudaDevice:
    """torch.cuda.device(d): makes `d` the current device inside the block, then restores it."""

    gpu: FakeGpu

    def __init__(self, device: Any) -> None:
        self.index = self.gpu.index(device) if device is not None else self.gpu.current

    def __enter__(self) -> None:
        self.previous, self.gpu.current = self.gpu.current, self.index

    def __exit__(self, *exc: object) -> None:
        self.gpu.current = self.previous


def _reader(gpu: FakeGpu, attr: str):  # noqa: ANN202 - tiny adapter
    """A stand-in for the torch.cuda memory counters, returning one FakeGpu field."""

    def read(device: Any = None) -> int:
        if gpu.spec.backend != "mps":
            gpu.index(device)
        return getattr(gpu, attr)

    return read


def install(
    monkeypatch: pytest.MonkeyPatch,
    kind: str = "h100_sxm",
    *,
    count: int = 1,
    name: str | None = None,
) -> FakeGpu:
    """Patch torch (and pynvml) so that it reports `count` GPUs of `kind`; returns their state."""
    if kind not in SPECS:
        raise ValueError(f"Unknown fake GPU {kind!r}; choose one of {', '.join(KINDS)}.")
    spec = SPECS[kind]
    if spec.backend == "mps":
        count = 1
    if count < 1:
        raise ValueError("count must be at least 1")
    gpu = FakeGpu(spec, count=count, name=name or spec.name)
    cudaish = spec.backend in ("cuda", "rocm")
    cuda = torch.cuda

    monkeypatch.setattr(cuda, "is_available", lambda: cudaish)
    monkeypatch.setattr(cuda, "device_count", lambda: count if cudaish else 0)
    monkeypatch.setattr(torch.version, "cuda", CUDA_VERSION if spec.backend == "cuda" else None)
    monkeypatch.setattr(torch.version, "hip", HIP_VERSION if spec.backend == "rocm" else None)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: spec.backend == "mps")
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: spec.backend == "mps")
    if hasattr(torch, "xpu"):
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)

    memory = {
        "memory_allocated": _reader(gpu, "allocated"),
        "memory_reserved": _reader(gpu, "reserved"),
        "max_memory_allocated": _reader(gpu, "peak_allocated"),
        "max_memory_reserved": _reader(gpu, "peak_reserved"),
        "reset_peak_memory_stats": gpu.reset_peak,
        "empty_cache": gpu.empty_cache,
    }
    if cudaish:

        def set_device(device: Any) -> None:
            gpu.current = gpu.index(device)

        cuda_fakes = {
            "current_device": lambda: gpu.current,
            "set_device": set_device,
            "get_device_properties": gpu.properties,
            "get_device_name": lambda device=None: gpu.properties(device).name,
            "get_device_capability": lambda device=None: (
                gpu.properties(device).major,
                gpu.properties(device).minor,
            ),
            "is_bf16_supported": gpu.bf16_supported,
            "synchronize": gpu.synchronize,
            "mem_get_info": gpu.mem_get_info,
            "Event": type("FakeEvent", (FakeEvent,), {"gpu": gpu}),
            "device": type("FakeCudaDevice", (FakeCudaDevice,), {"gpu": gpu}),
            **memory,
        }
        for attr, fake in cuda_fakes.items():
            monkeypatch.setattr(cuda, attr, fake)
    else:
        mps_fakes = {
            "synchronize": lambda: gpu.synchronize(),
            "current_allocated_memory": lambda: gpu.allocated,
            "driver_allocated_memory": lambda: gpu.reserved,
            "recommended_max_memory": lambda: spec.total_memory,
            "empty_cache": gpu.empty_cache,
        }
        for attr, fake in mps_fakes.items():
            monkeypatch.setattr(torch.mps, attr, fake)

    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "current_accelerator"):
        kind_name = "mps" if spec.backend == "mps" else "cuda"
        acc_fakes = {
            "is_available": lambda: True,
            "current_accelerator": lambda check_available=False: torch.device(kind_name),
            "device_count": lambda: 1 if spec.backend == "mps" else count,
            "current_device_index": lambda: 0 if spec.backend == "mps" else gpu.current,
            "current_device_idx": lambda: 0 if spec.backend == "mps" else gpu.current,
            "synchronize": gpu.synchronize,
            "get_memory_info": gpu.mem_get_info,
            # torch 2.15's Optimizer.step asks the accelerator's stream whether it is capturing
            "current_stream": lambda device=None: types.SimpleNamespace(
                is_capturing=lambda: False, synchronize=gpu.synchronize
            ),
            **memory,
        }
        for attr, fake in acc_fakes.items():
            if hasattr(acc, attr):
                monkeypatch.setattr(acc, attr, fake)
            if hasattr(acc, "memory") and hasattr(acc.memory, attr):
                monkeypatch.setattr(acc.memory, attr, fake)

    monkeypatch.setitem(__import__("sys").modules, "pynvml", gpu.nvml)
    return gpu
