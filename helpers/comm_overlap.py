"""Overlap arithmetic, buckets, shards and labelled ranges for data parallelism by hand (chapter 8).

Imported by the chapter 8 scripts (on every rank) and by the notebook: torch and the standard
library only, nothing that draws. A *span* is ``(start, end)`` in seconds on one clock:

- ``hidden_communication(comm, compute)``: how much of the time some all-reduce was in flight
  overlapped compute (hidden), and how much the step had to wait for (exposed);
- ``kernel_spans(events)``: those spans on a GPU, from the profiler's kernels (NCCL kernels
  are communication, every other kernel compute);
- ``trace_spans(trace, names)``: spans read back from a Chrome/Perfetto trace file;
- ``plan_buckets`` and ``shard_bounds``: how gradients are grouped and the flat parameter
  vector is cut among ranks;
- ``ring_wire_bytes``, ``fit_alpha_beta``, ``bucket_wait``, ``sweep_caps``: bytes a rank puts
  on the wire, the alpha-beta cost of an all-reduce, the wait it predicts after backward for a
  bucket size, and the bucket sizes to sweep; ``pipeline_wait`` and ``model_bucket_size``: that
  wait in closed form and the bucket size that minimises it;
- ``collective(name)``: the one-tensor collective under the name the installed torch
  recommends (torch 2.13 renamed two of them and deprecated the old names);
- ``labelled(name, device)``: one range that the PyTorch profiler records and, on CUDA, Nsight
  Systems too (NVTX); ``capture_range`` the stretch nsys records (cudaProfilerStart/Stop);
  ``nsys_command`` prints the command that records it.
"""

from __future__ import annotations

import contextlib
import math
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from helpers.i18n import tr

Span = tuple[float, float]

#: Substring of every NCCL kernel's name (ncclDevKernel_AllReduce_..., ncclKernel_...); RCCL too.
NCCL_KERNEL = "nccl"


def merge_spans(spans: Iterable[Span]) -> list[Span]:
    """Sorted, non-overlapping spans covering the same time as `spans` (chapter 8)."""
    merged: list[list[float]] = []
    for start, end in sorted((float(s), float(e)) for s, e in spans):
        if end < start:
            raise ValueError(
                tr("A span ends before it starts: ({start}, {end}).").format(start=start, end=end)
            )
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def total_length(spans: Iterable[Span]) -> float:
    """Seconds covered by at least one span (chapter 8)."""
    return sum(e - s for s, e in merge_spans(spans))


def overlap_length(a: Iterable[Span], b: Iterable[Span]) -> float:
    """Seconds covered by both a span of `a` and a span of `b` (chapter 8)."""
    left, right = merge_spans(a), merge_spans(b)
    i = j = 0
    both = 0.0
    while i < len(left) and j < len(right):
        lo, hi = max(left[i][0], right[j][0]), min(left[i][1], right[j][1])
        both += max(0.0, hi - lo)
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1
    return both


def hidden_communication(comm: Iterable[Span], compute: Iterable[Span]) -> dict[str, float]:
    """In-flight, hidden (under compute) and exposed communication seconds, and the hidden share (chapter 8)."""
    comm, compute = list(comm), list(compute)
    in_flight = total_length(comm)
    hidden = overlap_length(comm, compute)
    return {
        "in flight s": in_flight,
        "hidden s": hidden,
        "exposed s": in_flight - hidden,
        "hidden share": hidden / in_flight if in_flight > 0 else 0.0,
    }


def kernel_spans(events: Iterable[Any]) -> tuple[list[Span], list[Span]]:
    """(communication, compute) spans in seconds of the GPU kernels in profiler events (chapter 8)."""
    comm: list[Span] = []
    compute: list[Span] = []
    for e in events:
        kind = getattr(getattr(e, "device_type", None), "name", str(getattr(e, "device_type", "")))
        if kind.upper() not in ("CUDA", "PRIVATEUSE1", "HIP"):
            continue  # CPU ops and ranges: the GPU's own timeline is what counts here
        span = (e.time_range.start / 1e6, e.time_range.end / 1e6)  # profiler times are in µs
        (comm if NCCL_KERNEL in e.name.lower() else compute).append(span)
    return comm, compute


def trace_spans(trace: Mapping[str, Any], names: Sequence[str]) -> dict[str, list[Span]]:
    """Spans in seconds of the complete ('X') events of a Chrome trace whose name starts with each of `names` (chapter 8)."""
    found: dict[str, list[Span]] = {n: [] for n in names}
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or "dur" not in e:
            continue
        for n in names:
            if str(e.get("name", "")).startswith(n):
                start = float(e["ts"]) / 1e6  # Chrome traces count microseconds
                found[n].append((start, start + float(e["dur"]) / 1e6))
    return found


def allreduce_rounding_bound(abs_sum: list[torch.Tensor], world: int) -> list[torch.Tensor]:
    """Per element, how far two orders of summing and averaging `world` gradients can differ in fp32 (chapter 8).

    Each way computes mean = sum of the ranks' g_r (divided before or after). Summing W terms
    in any order, with one division each or in all, is within (W + 1) u sum|g_r| / W of the
    exact mean (u = eps / 2, the unit roundoff: W - 1 additions, the divisions, Higham's
    bound for recursive summation); two such results are within twice that of each other.
    """
    eps = torch.finfo(torch.float32).eps
    return [(world + 1) * eps * s / world for s in abs_sum]


def plan_buckets(sizes: Sequence[int], cap_bytes: int) -> list[list[int]]:
    """Indices of `sizes` (bytes) in order, a bucket closed once it holds `cap_bytes` or more, as DDP does (chapter 8)."""
    if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes <= 0:
        raise ValueError(
            tr("cap_bytes must be a positive whole number of bytes, got {value!r}.").format(
                value=cap_bytes
            )
        )
    buckets: list[list[int]] = [[]]
    filled = 0
    for i, size in enumerate(sizes):
        if size < 0:
            raise ValueError(
                tr("Sizes are byte counts >= 0, got {size} at index {i}.").format(size=size, i=i)
            )
        buckets[-1].append(i)
        filled += size
        if filled >= cap_bytes:
            buckets.append([])
            filled = 0
    return [b for b in buckets if b]


def ring_wire_bytes(nbytes: int, world: int) -> float:
    """Bytes each rank sends in a ring all-reduce of an `nbytes` buffer: 2(W-1)/W of it (chapter 8).

    Reduce-scatter then all-gather, W - 1 steps each, a 1/W piece per step; no all-reduce in
    which the ranks do the additions themselves sends less per rank (NCCL's tree sends about as
    much at large W). Switches that add in the network (NCCL's NVLS on NVSwitch, SHARP on
    InfiniBand) need only about the buffer once from each rank.
    """
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(
            tr("world must be a whole number >= 1, got {value!r}.").format(value=world)
        )
    return 2 * (world - 1) / world * nbytes


def fit_alpha_beta(nbytes: Sequence[float], seconds: Sequence[float]) -> dict[str, float]:
    """alpha (s per call) and beta (s per byte) of t(n) = alpha + n beta, least relative squares (chapter 8).

    Each point is weighted by 1/t^2, so a 4 KiB call counts as much as a 256 MiB one: an
    ordinary fit would give alpha from the largest sizes' noise. Also returns the largest
    relative gap between a measured time and the line.
    """
    if len(nbytes) != len(seconds) or len(set(nbytes)) < 2:
        raise ValueError(tr("The fit needs times measured at two or more different sizes."))
    if min(seconds) <= 0:
        raise ValueError(tr("Times must be positive, got {value}.").format(value=min(seconds)))
    w = [1 / t**2 for t in seconds]
    sw = sum(w)
    sn = sum(wi * n for wi, n in zip(w, nbytes))
    snn = sum(wi * n * n for wi, n in zip(w, nbytes))
    st = sum(wi * t for wi, t in zip(w, seconds))
    snt = sum(wi * n * t for wi, n, t in zip(w, nbytes, seconds))
    det = sw * snn - sn * sn
    beta = (sw * snt - sn * st) / det
    alpha = (st - beta * sn) / sw
    worst = max(abs(alpha + beta * n - t) / t for n, t in zip(nbytes, seconds))
    return {"alpha s": alpha, "beta s/B": beta, "worst gap": worst}


def bucket_wait(
    sizes: Sequence[int], cap_bytes: int, alpha: float, beta: float, backward_s: float
) -> float:
    """Seconds the alpha-beta model says a step waits after backward, with buckets of `cap_bytes` (chapter 8).

    `sizes` are the gradients' bytes in the order backward produces them, produced at an even
    rate of bytes per second over `backward_s`; a bucket's all-reduce starts once it is full
    and the previous one is done (launched in order, one at a time) and takes alpha + n beta.
    Communication is assumed not to slow backward down: on a GPU it shares the SMs, on a CPU
    the cores, so the measured sweep is the judge.
    """
    total = sum(sizes)
    per_byte = backward_s / total if total else 0.0
    ready = done = 0.0
    for bucket in plan_buckets(sizes, cap_bytes):
        n = sum(sizes[i] for i in bucket)
        ready += n * per_byte
        done = max(done, ready) + alpha + n * beta
    return max(done - backward_s, 0.0)


def pipeline_wait(
    bucket: float, total: float, alpha: float, beta: float, backward_s: float
) -> float:
    """bucket_wait in closed form: `total` bytes produced evenly over `backward_s`, buckets of `bucket` bytes (chapter 8).

    The total / s buckets go out in order, one at a time, alpha + s beta each. Either each
    bucket is done before the next one is full, and only the last one is exposed:
    alpha + s beta; or communication is the bottleneck, and the calls run back to back from the
    moment the first bucket is full (s B / G) to s B / G + (G / s)(alpha + s beta). The wait
    after backward is the larger: max(alpha + s beta, s B / G + G alpha / s + G beta - B).
    """
    if bucket <= 0 or total <= 0:
        raise ValueError(
            tr("Bucket and total are byte counts > 0, got {bucket} and {total}.").format(
                bucket=bucket, total=total
            )
        )
    last = alpha + bucket * beta
    queued = bucket * backward_s / total + total * alpha / bucket + total * beta - backward_s
    return max(last, queued)


def model_bucket_size(
    total: float, alpha: float, beta: float, backward_s: float
) -> tuple[float, str]:
    """The bucket size (bytes) that minimises pipeline_wait, and the rule that gave it (chapter 8).

    Where communication is the bottleneck, the wait's terms that depend on s are the first
    bucket's fill time s B / G and the calls' G alpha / s: their sum is smallest at
    s* = G sqrt(alpha / B). Where communication can keep up (beta G < B), the smallest bucket
    that does, s = G alpha / (B - beta G), is where the two branches of the wait cross, and it
    leaves only its own alpha + s beta exposed. Each candidate is kept within 1..G bytes; the one
    with the smaller wait wins (G sqrt(alpha / B) on a tie).
    """
    root = total * math.sqrt(alpha / backward_s) if backward_s > 0 else math.inf
    candidates = [(root, "s* = G sqrt(alpha / B)")]
    if beta * total < backward_s:
        keep_up = total * alpha / (backward_s - beta * total)
        candidates.append((keep_up, "s = G alpha / (B - beta G)"))

    def wait(candidate: tuple[float, str]) -> float:
        bucket = min(max(candidate[0], 1.0), float(total))  # 1 byte to one bucket for all
        return pipeline_wait(bucket, total, alpha, beta, backward_s)

    return min(candidates, key=wait)


def sweep_caps(sizes: Sequence[int], multiples: Sequence[int] = (1, 2, 3, 4)) -> list[int]:
    """Bucket caps to sweep: multiples of the largest gradient, and one bucket for all (chapter 8)."""
    largest, total = max(sizes), sum(sizes)
    return sorted({min(k * largest, total) for k in multiples} | {total})


#: The one-tensor collectives torch 2.13 renamed, each new name with the old one (torch 2.5-2.12),
#: which 2.13 keeps as a deprecated alias (a FutureWarning at every call); same arguments.
RENAMED_COLLECTIVES = {
    "all_gather_single": "all_gather_into_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
}


def collective(name: str) -> Callable[..., Any]:
    """dist.<name> on torch 2.13+, else its old name (RENAMED_COLLECTIVES), never a deprecated one (chapter 8)."""
    if name not in RENAMED_COLLECTIVES:
        raise ValueError(
            tr("Unknown collective {op!r}; known: {known}.").format(
                op=name, known=", ".join(RENAMED_COLLECTIVES)
            )
        )
    return getattr(dist, name, None) or getattr(dist, RENAMED_COLLECTIVES[name])


def shard_bounds(numel: int, world: int, rank: int) -> tuple[int, int, int]:
    """(start, stop, shard size): rank's piece of a flat vector of `numel` padded to world x size (chapter 8)."""
    for name, value, low in (("numel", numel, 0), ("world", world, 1), ("rank", rank, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(
                tr("{name} must be a whole number >= {low}, got {value!r}.").format(
                    name=name, low=low, value=value
                )
            )
    if rank >= world:
        raise ValueError(
            tr("rank {rank} does not exist in a world of {world} rank(s).").format(
                rank=rank, world=world
            )
        )
    size = -(-numel // world)  # ceil: the last piece is padded with zeros
    return rank * size, (rank + 1) * size, size


def nvtx_wanted(device: str | torch.device) -> bool:
    """Whether ranges on `device` also go to NVTX and the CUDA profiler API: on CUDA only (chapter 8)."""
    return torch.device(device).type == "cuda"


@contextlib.contextmanager
def capture_range(device: str | torch.device) -> Iterator[None]:
    """What `nsys profile --capture-range=cudaProfilerApi` records: cudaProfilerStart to Stop (chapter 8)."""
    on = nvtx_wanted(device)
    if on:
        torch.cuda.profiler.start()
    try:
        yield
    finally:
        if on:
            torch.cuda.profiler.stop()


@contextlib.contextmanager
def labelled(name: str, device: str | torch.device) -> Iterator[None]:
    """A range the PyTorch profiler records, and on CUDA also an NVTX range for Nsight Systems (chapter 8)."""
    nvtx = nvtx_wanted(device)
    with record_function(name):
        if nvtx:
            torch.cuda.nvtx.range_push(name)
        try:
            yield
        finally:
            if nvtx:
                torch.cuda.nvtx.range_pop()


def nsys_command(
    script: str, nproc: int, args: Sequence[object] = (), output: str = "ch08_overlap"
) -> str:
    """The Nsight Systems command that records CUDA kernels and NVTX ranges of a torchrun job (chapter 8).

    Only between cudaProfilerStart and Stop (``capture_range``: the script's labelled steps,
    warm-up left out), and with torch.profiler off in that run: two CUPTI clients clash.
    """
    words = ["nsys", "profile", "-t", "cuda,nvtx,osrt", "--capture-range=cudaProfilerApi"]
    words += ["--capture-range-end=stop", "-o", output, "--force-overwrite", "true"]
    words += ["torchrun", "--standalone", f"--nproc-per-node={nproc}", script]
    return shlex.join([*words, *(str(a) for a in args)])
