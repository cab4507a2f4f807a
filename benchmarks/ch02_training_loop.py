"""Chapter 2 benchmark: the sources' training loop vs the chapter's final loop, same math.

    python benchmarks/ch02_training_loop.py                 # best device here
    python benchmarks/ch02_training_loop.py --device cpu --min-run-time 2
    python benchmarks/ch02_training_loop.py --seeds 5       # check the notebook's seed only

Both loops train the sources' MLP (20-64-32-1) on the sources' 10,000 x 20 task with batch
64, from the same initial weights and with the same permutation every epoch. The script first
checks that they compute the same math, for the notebook's permutation seed (5) and the other
seeds of 0-7, so that it cannot pass by the luck of one seed. Then it times whole epochs of
the notebook's seed with helpers.timing.benchmark and prints: ms/epoch, µs/step, host syncs
per epoch (counted in one epoch of each timed loop), the speed-up, the machine's state, and how far the final loop's step is from the
per-step floor (on a CPU: the reference figure, about 300 µs on the course's 2-core CI CPU,
and the floor measured here, the fastest eager step at batch sizes 8-32).

On CUDA the final loop replays the whole step (forward, backward, capturable Adam) as one CUDA
graph per batch shape (helpers.cuda_graphs), and the eager resident loop with FlatAdam gets its
own row. Capturable Adam computes its bias corrections in float32 on the device, which moves
every update by a few parts per million (helpers.cuda_graphs.bias_correction_rows); the same-
math check measures that effect by running the eager loop with capturable=False and True, and
requires (1) the graph replays to equal the eager capturable loop to rounding and (2) the final
loop to differ from the sources' loop by that effect plus rounding (helpers.loops.same_but_for).
If capture fails, the script prints the error and times the eager final loop instead. On CPU
and MPS there are no CUDA graphs: the final loop is the eager resident loop with FlatAdam, whose
bias corrections are Python floats like the sources' loop's.

The speed targets (chapter 2 issues 14 and 15): the final loop runs at least 2.5x faster per
epoch than the sources' loop on the 2-core CPU, and at least 10x on an H100. They are
printed, never asserted: timings are noisy. A failed same-math check exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DataLoader, TensorDataset

from helpers.batching import PermutationSampler, ResidentBatches
from helpers.cuda_graphs import (
    batch_shapes,
    capturable_adam,
    capture_steps,
    graph_capture_plan,
    graphed_epoch,
)
from helpers.data import make_classification_data
from helpers.devices import cpu_name, describe_device, pick_device
from helpers.loops import (
    ROUNDING_PARAMS_ATOL,
    FlatAdam,
    adam_pair,
    best_adam_impl,
    fast_epoch,
    flatten_parameters,
    make_adam,
    same_but_for,
    sources_epoch,
    torch_threads,
)
from helpers.machine_state import merge_states
from helpers.models import make_mlp
from helpers.syncs import SyncCounter
from helpers.tables import print_table
from helpers.throughput import measure_batch_size
from helpers.timing import benchmark

BENCHMARK_VERSION = 5  # bump when what is measured changes (5: syncs counted for every loop)
TARGET_SPEEDUP = 2.5  # on a CPU
TARGET_SPEEDUP_GRAPH = 10.0  # on an H100, with the CUDA-graph final loop
REFERENCE_FLOOR_US = 300.0  # the 2-core CI CPU's eager step: a CPU reference only
BATCH, EPOCHS_CHECKED, INIT_SEED = 64, 2, 0
#: The notebook's permutation seed first (section 6 of chapter 2), then the rest of 0-7: the
#: old same-math tolerance held for 2 of these 8 seeds with capturable Adam (AUDIT finding 1).
PERM_SEEDS = (5, 0, 1, 2, 3, 4, 6, 7)


def _batches(x: torch.Tensor, y: torch.Tensor, seed: int) -> ResidentBatches:
    """The final loop's batches: one permutation per epoch from `seed`."""
    return ResidentBatches(x, y, batch_size=BATCH, generator=torch.Generator().manual_seed(seed))


def build(device: torch.device, seed: int):
    """Both loops' models, data feeds and optimizers, with the same init and permutations."""
    x, y = make_classification_data(10_000, 20, seed=INIT_SEED)
    torch.manual_seed(INIT_SEED)
    src_model = make_mlp(sigmoid=True).to(device)
    final_model = make_mlp().to(device)
    final_model.load_state_dict(src_model.state_dict())
    loader = DataLoader(
        TensorDataset(x, y),
        batch_size=BATCH,
        sampler=PermutationSampler(len(x), torch.Generator().manual_seed(seed)),
        pin_memory=device.type == "cuda",
    )
    x_dev, y_dev = x.to(device), y.to(device)
    torch_adam_model = make_mlp().to(device)
    torch_adam_model.load_state_dict(src_model.state_dict())
    src = (src_model, loader, torch.optim.Adam(src_model.parameters(), lr=1e-3), nn.BCELoss())
    impl = best_adam_impl(device)
    final = (
        final_model,
        _batches(x_dev, y_dev, seed),
        FlatAdam(flatten_parameters(final_model), lr=1e-3),
    )
    with_torch_adam = (
        torch_adam_model,
        _batches(x_dev, y_dev, seed),
        make_adam(torch_adam_model.parameters(), 1e-3, impl),
    )
    return x, y, src, final, with_torch_adam, impl


def build_graphed(device: torch.device, x: torch.Tensor, y: torch.Tensor, init: dict, seed: int):
    """The CUDA-graph final loop: (steps, batches) from init's weights, or (None, why) if capture fails."""
    model = make_mlp().to(device)
    model.load_state_dict(init)
    x_dev, y_dev = x.to(device), y.to(device)
    try:
        steps = capture_steps(
            model, capturable_adam(model.parameters(), lr=1e-3), nn.BCEWithLogitsLoss(),
            x_dev, y_dev, batch_shapes(len(x), BATCH),
        )  # fmt: skip
    except Exception as exc:  # a capture that fails on this GPU/torch: say so, time eager
        return None, f"CUDA graph capture failed ({type(exc).__name__}: {str(exc)[:200]})"
    return (steps, _batches(x_dev, y_dev, seed), model), ""


def check_seed(device: torch.device, seed: int, graphed: bool) -> tuple[dict, bool, dict]:
    """One seed's same-math check: (its table row, passed, syncs per epoch of each loop)."""
    x, y, (sm, loader, sopt, crit), (fm, batches, fopt), _, _ = build(device, seed)
    init = {k: v.clone() for k, v in sm.state_dict().items()}
    with SyncCounter() as src_syncs:
        src = [
            v for _ in range(EPOCHS_CHECKED) for v in sources_epoch(sm, loader, sopt, crit, device)
        ]
    src_params, effect, checks = parameters_to_vector(sm.parameters()), None, []
    if graphed:
        built, why = build_graphed(device, x, y, init, seed)
        if built is None:
            raise RuntimeError(why)
        steps, gbatches, fm = built
        with SyncCounter() as final_syncs:
            final = [v for _ in range(EPOCHS_CHECKED) for v in graphed_epoch(steps, gbatches)]
        x_dev, y_dev = x.to(device), y.to(device)

        def start() -> nn.Module:
            model = make_mlp().to(device)
            model.load_state_dict(init)
            return model

        effect = adam_pair(
            start, lambda: _batches(x_dev, y_dev, seed), nn.BCEWithLogitsLoss(), EPOCHS_CHECKED,
            "capturable",
        )  # fmt: skip
        eager = effect[1]  # the same loop as the graphs, run eagerly: equal to rounding
        checks.append(same_but_for(final, eager.losses, what="graph replays vs eager"))
        graph_params = parameters_to_vector(fm.parameters())
        checks.append(
            same_but_for(
                graph_params,
                eager.params,
                what="graph vs eager parameters",
                atol=ROUNDING_PARAMS_ATOL,
            )
        )
    else:
        with SyncCounter() as final_syncs:
            final = [
                v
                for _ in range(EPOCHS_CHECKED)
                for v in fast_epoch(fm, batches, fopt, nn.BCEWithLogitsLoss())
            ]
    losses = same_but_for(final, src, None if effect is None else [e.losses for e in effect])
    params = same_but_for(
        parameters_to_vector(fm.parameters()), src_params,
        None if effect is None else [e.params for e in effect], atol=ROUNDING_PARAMS_ATOL,
    )  # fmt: skip
    checks += [losses, params]
    syncs = {
        "sources": src_syncs.count // EPOCHS_CHECKED,
        "final": final_syncs.count // EPOCHS_CHECKED,
    }
    ok = all(c.ok for c in checks) and syncs == {"sources": len(loader), "final": 1}
    row = {
        "seed": seed,
        "loss gap": losses.gap,
        "capturable Adam's effect": "-" if losses.effect is None else losses.effect,
        "loss gap, effect removed": losses.residual if losses.effect is not None else "-",
        "param gap, effect removed": params.residual,
        "syncs/epoch (sources, final)": f"{syncs['sources']}, {syncs['final']}",
        "same math": "yes" if ok else "NO: " + "; ".join(str(c) for c in checks if not c.ok),
    }  # fmt: skip
    return row, ok, syncs


def floor_line(final_us: float, floor_us: float, graphed: bool) -> str:
    """The last line: the final step against the per-step floor (eager floor on CUDA, no CPU reference there)."""
    if graphed:
        return (
            f"final loop step: {final_us:.0f} µs (median), {final_us / floor_us:.2f}x the eager "
            f"per-step floor measured here ({floor_us:.0f} µs, the fastest eager FlatAdam step "
            "at batch 8-32): the CUDA graphs replay the step without the per-kernel launches "
            "that the eager floor is made of"
        )
    return (
        f"final loop step: {final_us:.0f} µs (median); reference dispatch floor "
        f"{REFERENCE_FLOOR_US:.0f} µs on the course's 2-core CI CPU ({final_us / REFERENCE_FLOOR_US:.2f}x "
        f"of it); floor measured here (fastest step at batch 8-32): {floor_us:.0f} µs, so the "
        f"final step is {final_us - floor_us:+.0f} µs ({final_us / floor_us:.2f}x) from it"
    )


def parse_seeds(text: str) -> tuple[int, ...]:
    """'5,0,1' -> (5, 0, 1); a clear error for anything else."""
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--seeds takes integers separated by commas, got {text!r}"
        ) from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"--seeds needs at least one seed >= 0, got {text!r}")
    return seeds


def _call_args(epoch_fn: Callable, epoch_args: tuple, device: torch.device) -> tuple:
    """The arguments of one epoch: the sources' loop also takes the device."""
    return (*epoch_args, device) if epoch_fn is sources_epoch else epoch_args


def count_syncs(loops: dict, device: torch.device) -> dict[str, int]:
    """Host syncs in one epoch of every loop, counted with SyncCounter (the epoch also warms it up)."""
    counts = {}
    for name, (threads, epoch_fn, epoch_args) in loops.items():
        with torch_threads(threads), SyncCounter() as syncs:
            epoch_fn(*_call_args(epoch_fn, epoch_args, device))
        counts[name] = syncs.count
    return counts


def time_loops(loops: dict, rounds: int, min_run_time: float, device: torch.device) -> dict:
    """Interleaved rounds of every loop: {name: [BenchResult per round]}."""
    timed: dict[str, list] = {name: [] for name in loops}
    for _ in range(rounds):  # a burst of load on a shared machine then hits every loop alike
        for name, (threads, epoch_fn, epoch_args) in loops.items():
            with torch_threads(threads):
                r = benchmark(
                    epoch_fn, *_call_args(epoch_fn, epoch_args, device), device=device, warmup=1,
                    min_run_time=min_run_time, min_repeats=3,
                )  # fmt: skip
            timed[name].append(r)
    return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: best)")
    parser.add_argument(
        "--min-run-time", type=float, default=0.3, help="seconds per timing, per round"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads for the final loop on a CPU (default 1)"
    )
    parser.add_argument(
        "--seeds", type=parse_seeds, default=PERM_SEEDS,
        help="permutation seeds of the same-math check, the first one timed (default 5,0,1,2,3,4,6,7)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.min_run_time <= 0:
        parser.error("--rounds must be >= 1 and --min-run-time > 0")
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    device = pick_device(args.device)
    default_threads = torch.get_num_threads()
    final_threads = args.threads if device.type == "cpu" else None
    seed = args.seeds[0]

    x, y, (sm, loader, sopt, crit), (fm, batches, fopt), (tm, tbatches, topt), impl = build(
        device, seed
    )
    graph_ok, graph_why = graph_capture_plan(device)
    graphed = None
    if graph_ok:
        graphed, failure = build_graphed(device, x, y, sm.state_dict(), seed)
        graph_why = failure or graph_why
    checked, passed = [], True
    with torch_threads(final_threads):
        for s in args.seeds:
            row, ok, _ = check_seed(device, s, graphed is not None)
            checked.append(row)
            passed &= ok

    bce = nn.BCEWithLogitsLoss()
    src = (sm, loader, sopt, crit)
    loops = {f"sources' loop ({default_threads} threads, as written)": (None, sources_epoch, src)}
    if device.type == "cpu" and final_threads != default_threads:
        loops[f"sources' loop ({final_threads} thread(s))"] = (final_threads, sources_epoch, src)
    loops[f"resident loop, torch.optim.Adam {impl}"] = (
        final_threads, fast_epoch, (tm, tbatches, topt, bce),
    )  # fmt: skip
    eager_final = "final loop" if graphed is None else "resident loop, FlatAdam (eager final)"
    loops[eager_final] = (final_threads, fast_epoch, (fm, batches, fopt, bce))
    if graphed is not None:
        loops["final loop"] = (None, graphed_epoch, graphed[:2])
    loop_syncs = count_syncs(loops, device)  # every timed loop's own count, none assumed
    timed = time_loops(loops, args.rounds, args.min_run_time, device)
    with torch_threads(final_threads):
        floor_rows = [
            measure_batch_size(b, x=x.to(device), y=y.to(device), min_run_time=0.3, flat_adam=True)
            for b in (8, 16, 32)
        ]
    floor_us = min(r["µs/step"] for r in floor_rows)
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    median = {name: statistics.median(r.median for r in v) for name, v in timed.items()}
    best = {name: min(r.median for r in v) for name, v in timed.items()}
    state = merge_states([r.machine for v in timed.values() for r in v])
    steps = len(loader)

    print(f"chapter 2 benchmark v{BENCHMARK_VERSION}: sources' loop vs final loop, same math")
    info = describe_device(device)
    print(f"device {device} ({info.name}); CPU {cpu_name()}; torch {torch.__version__}")
    print(
        f"load average at start / end: {load_start:.2f} / {load_end:.2f} on {os.cpu_count()} "
        f"CPUs; {args.rounds} interleaved rounds of each loop"
    )
    print(
        "final loop: resident data + randperm/index_select, "
        + (
            "one CUDA graph per batch shape (whole step, capturable Adam), one sync per epoch"
            if graphed is not None
            else "BCEWithLogitsLoss, flat parameters + FlatAdam, one sync per epoch"
        )
        + (f", {final_threads} CPU thread(s)" if final_threads else "")
    )
    print(f"CUDA graphs: {graph_why}")
    print()
    print(
        f"same math, {EPOCHS_CHECKED} epochs x {steps} steps per seed (rounding: "
        "helpers.loops.ROUNDING_*; capturable Adam's effect measured by an eager pair and "
        "removed step by step):"
    )
    print_table(checked)
    print()
    rows = []
    for name in loops:
        rows.append(
            {
                "loop": name,
                "ms/epoch (median)": median[name] * 1e3,
                "ms/epoch (best round)": best[name] * 1e3,
                "µs/step (median)": median[name] / steps * 1e6,
                "syncs/epoch": loop_syncs[name],
                "final is x faster (median)": median[name] / median["final loop"],
                "(best rounds)": best[name] / best["final loop"],
            }
        )
    print(f"timed with permutation seed {seed}:")
    print_table(rows)
    print(state)
    first = rows[0]
    print()
    target = TARGET_SPEEDUP if graphed is None else TARGET_SPEEDUP_GRAPH
    where = "CPU target" if graphed is None else "H100 target for the CUDA-graph loop"
    caveat = (
        "" if state is None or state.quiet else f"; measured on a busy machine: {state.caveat()}"
    )
    for label, ratio in (
        ("median", first["final is x faster (median)"]),
        ("best rounds", first["(best rounds)"]),
    ):
        verdict = "meets" if ratio >= target else "is BELOW"
        print(
            f"speed-up vs the sources' loop as written ({label}): {ratio:.2f}x "
            f"({verdict} the {target}x {where}{caveat})"
        )
    print(floor_line(median["final loop"] / steps * 1e6, floor_us, graphed is not None))
    if not passed:
        failed = [str(r["seed"]) for r in checked if r["same math"] != "yes"]
        print(f"SAME MATH FAILED for seed(s): {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
