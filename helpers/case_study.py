"""The chapter's case study: a deliberately slow training loop, and its fixes one at a time (chapter 6)."""

from __future__ import annotations

import io
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import nn
from torch.profiler import record_function
from torch.utils.data import DataLoader, Dataset, TensorDataset

from helpers.data import make_classification_data
from helpers.devices import resolve_device
from helpers.i18n import tr, tr_mark
from helpers.machine_state import MachineState, merge_states
from helpers.models import make_mlp
from helpers.plots import wrap_title
from helpers.tables import format_table
from helpers.timing import benchmark
from helpers.units import Printed
from helpers.validate import positive_int
from helpers.verdicts import Verdict, compare_rows

#: The fixes in the order the table adds them. The per-step .item() comes after the resident
#: fix: until then every step also copies its batch from pageable memory with a blocking
#: .to(device), so removing the .item() could not let the CPU run ahead of the GPU.
#: The names are data (rows and verdicts look them up); printed, they are translated (_shown_name).
FIX_NAMES = {
    "preprocess_once": tr_mark("preprocess once, vectorised"),
    "resident": tr_mark("resident tensors, no DataLoader"),
    "no_sync": tr_mark("no per-step .item() + print"),
    "big_batch": tr_mark("bigger batch (changes the math)"),
}

#: The cumulative variants of the case-study table: each adds one fix to the one before.
VARIANTS: list[tuple[str, dict[str, bool]]] = [(tr_mark("slow loop, as written"), {})] + [
    ("+ " + FIX_NAMES[key], dict.fromkeys(list(FIX_NAMES)[: i + 1], True))
    for i, key in enumerate(FIX_NAMES)
]
#: The phases train() labels with record_function, and the columns chapter 6 prints their
#: times under: the profile keeps the English labels, a table shows them translated.
PHASES = (
    tr_mark("data"), tr_mark("forward"), tr_mark("backward"), tr_mark("optimizer"), tr_mark("logging"),
)  # fmt: skip
_PHASE_COLUMNS = (tr_mark("phase"), tr_mark("share"))
#: run_fixes' two variants, for the catalog.
_WIDGET_VARIANTS = (tr_mark("slow loop"), tr_mark("chosen fixes"))
#: The case-study table's column headers, for the catalog (format_table prints them translated).
_COLUMNS = (
    tr_mark("variant"), tr_mark("ms per epoch"), tr_mark("IQR (ms)"),
    tr_mark("speed-up vs previous"), tr_mark("speed-up vs slow"), tr_mark("final loss"),
    tr_mark("max |Δ param|"), tr_mark("same result as slow"), tr_mark("ms"),
)  # fmt: skip
#: The "same result as slow" column's words: the rows keep them (the notebook checks them),
#: the printed table translates them.
_SAME_WORDS = (tr_mark("yes"), tr_mark("NO"))
_DIFFERENT_MATH = tr_mark("different math (batch {batch}, {steps} steps)")


def fix_title(key: str) -> str:
    """The fix `key` of FIX_NAMES as the learner reads it, e.g. a checkbox's label; the key stays English (chapter 6)."""
    return tr(FIX_NAMES[key])


def _shown_name(name: str) -> str:
    """A variant's name in the learner's language: '+ ' and a fix, or a name of its own (chapter 6)."""
    if name.startswith("+ ") and name[2:] in FIX_NAMES.values():
        return "+ " + tr(name[2:])
    return tr(name)


def _shown_same(value: object) -> object:
    """A "same result as slow" cell in the learner's language (chapter 6)."""
    if value in _SAME_WORDS:
        return tr(str(value))
    found = re.fullmatch(r"different math \(batch (\d+), (\d+) steps\)", str(value))
    if found:
        return tr(_DIFFERENT_MATH).format(batch=found[1], steps=found[2])
    return value


def _shown_rows(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """The case-study rows with their names and words translated, for printing (chapter 6)."""
    shown = []
    for r in rows:
        row = {**r, "variant": _shown_name(str(r["variant"]))} if "variant" in r else dict(r)
        if "same result as slow" in row:
            row["same result as slow"] = _shown_same(row["same result as slow"])
        shown.append(row)
    return shown


def make_model() -> nn.Module:
    """The sources' MLP, 20-64-32-1, returning logits (chapter 6)."""
    return make_mlp((20, 64, 32, 1))


def preprocess(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Standardise with the data set's mean and std, clip to [-3, 3], in float64; return float32 (chapter 6)."""
    z = (x.double() - mean.double()) / std.double()
    return z.clamp(-3.0, 3.0).float()


class PreprocessingDataset(Dataset):
    """The slow input pipeline: the same preprocessing, in plain Python, one sample at a time (chapter 6)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, mean: torch.Tensor, std: torch.Tensor):
        self.x, self.y = x, y
        self.mean, self.std = mean.tolist(), std.tolist()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.x[i].tolist()  # Python floats are float64, like preprocess()
        z = [min(max((v - m) / s, -3.0), 3.0) for v, m, s in zip(row, self.mean, self.std)]
        return torch.tensor(z, dtype=torch.float32), self.y[i]


#: What plot_fixes says after the verdict, by run_fixes' "same result" (None: a bigger batch).
SAME_RESULT_WORDS = {
    None: tr_mark("changes the math"),
    True: tr_mark("same result"),
    False: tr_mark("DIFFERENT result"),
}


@dataclass
class CaseStudy:
    """Everything every variant shares: raw data, statistics, per-epoch permutations, initial weights (chapter 6)."""

    x: torch.Tensor
    y: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    perms: list[torch.Tensor]
    init_state: dict[str, torch.Tensor]
    batch_size: int = 64
    big_batch_size: int = 1024


def make_case_study(n_samples: int = 4096, epochs: int = 1, seed: int = 0) -> CaseStudy:
    """The sources' synthetic task, fixed permutations and fixed initial weights (chapter 6)."""
    n_samples, epochs = positive_int(n_samples, "n_samples"), positive_int(epochs, "epochs")
    x, y = make_classification_data(n_samples, 20, seed=seed)
    g = torch.Generator().manual_seed(seed)
    perms = [torch.randperm(n_samples, generator=g) for _ in range(epochs)]
    torch.manual_seed(seed)
    init = {k: v.clone() for k, v in make_model().state_dict().items()}
    return CaseStudy(x, y, x.mean(0), x.std(0), perms, init)


@dataclass
class RunResult:
    """What a training run computed: mean loss per epoch, final parameters, steps (chapter 6)."""

    epoch_losses: list[float]
    params: torch.Tensor
    steps: int


def train(
    cs: CaseStudy,
    device: str | torch.device = "cpu",
    *,
    no_sync: bool = False,
    preprocess_once: bool = False,
    resident: bool = False,
    big_batch: bool = False,
    log: io.StringIO | None = None,
    on_step: Callable[[], object] | None = None,
) -> RunResult:
    """Train the case study's MLP, one epoch per permutation in cs.perms; each keyword switches one fix on (chapter 6).

    `on_step` is called after every training step, e.g. ``prof.step`` of a running profiler.
    """
    device = resolve_device(device)
    log = io.StringIO() if log is None else log
    model = make_model()
    model.load_state_dict(cs.init_state)
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()
    batch = cs.big_batch_size if big_batch else cs.batch_size
    if resident:
        x_all, y_all = preprocess(cs.x, cs.mean, cs.std).to(device), cs.y.to(device)
    elif preprocess_once:
        dataset: Dataset = TensorDataset(preprocess(cs.x, cs.mean, cs.std), cs.y)
    else:
        dataset = PreprocessingDataset(cs.x, cs.y, cs.mean, cs.std)
    epoch_losses, steps = [], 0
    for epoch, perm in enumerate(cs.perms):
        if resident:
            batches = iter(perm.to(device).split(batch))
        else:
            batches = iter(DataLoader(dataset, batch_size=batch, sampler=perm.tolist()))
        total, total_on_device, n = 0.0, torch.zeros((), device=device), 0
        while True:
            with record_function("data"):
                item = next(batches, None)
                if item is None:
                    break
                xb, yb = (x_all[item], y_all[item]) if resident else item
                xb, yb = xb.to(device), yb.to(device)
            with record_function("forward"):
                loss = loss_fn(model(xb), yb)
            with record_function("backward"):
                opt.zero_grad(set_to_none=True)
                loss.backward()
            with record_function("optimizer"):
                opt.step()
            with record_function("logging"):
                if no_sync:
                    total_on_device += loss.detach()
                else:
                    value = loss.item()  # waits for the device, every step
                    total += value
                    print(f"epoch {epoch} step {n} loss {value:.4f}", file=log)
            n += 1
            if on_step is not None:
                on_step()  # e.g. prof.step() when profiling
        steps += n
        mean = (total_on_device / n).item() if no_sync else total / n
        print(f"epoch {epoch}: mean loss {mean:.4f}", file=log)
        epoch_losses.append(mean)
    params = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
    return RunResult(epoch_losses, params, steps)


def same_result(a: RunResult, b: RunResult, atol: float = 1e-6) -> bool:
    """True if two runs end with the same parameters (within atol) and the same epoch losses (chapter 6)."""
    if a.params.shape != b.params.shape or len(a.epoch_losses) != len(b.epoch_losses):
        return False
    losses_a, losses_b = torch.tensor(a.epoch_losses), torch.tensor(b.epoch_losses)
    return bool(
        torch.allclose(a.params, b.params, rtol=0.0, atol=atol)
        and torch.allclose(losses_a, losses_b, rtol=1e-5, atol=1e-7)
    )


def _check_fixes(fixes: dict[str, bool]) -> None:
    """A clear error for a fix the case study does not have (chapter 6)."""
    if unknown := set(fixes) - set(FIX_NAMES):
        raise ValueError(
            tr("Unknown fix(es) {unknown}; choose from {known}.").format(
                unknown=sorted(unknown), known=sorted(FIX_NAMES)
            )
        )


@dataclass(repr=False)
class VariantTiming:
    """One variant's seconds per epoch, one reading per round, what it computed and the machine's state (chapter 6)."""

    name: str
    fixes: dict[str, bool]
    seconds: list[float]
    result: RunResult
    machine: MachineState | None

    @property
    def median(self) -> float:
        """Median seconds per epoch over the rounds (chapter 6)."""
        return statistics.median(self.seconds)

    @property
    def iqr(self) -> float:
        """Interquartile range of the rounds' seconds per epoch; 0 for one round (chapter 6)."""
        if len(self.seconds) < 2:
            return 0.0
        q = statistics.quantiles(self.seconds, n=4, method="inclusive")
        return q[2] - q[0]


def time_interleaved(
    cs: CaseStudy,
    device: str | torch.device,
    variants: list[tuple[str, dict[str, bool]]],
    rounds: int = 5,
    min_run_time: float = 0.05,
) -> list[VariantTiming]:
    """Time the variants in interleaved rounds: each round runs each once, in a rotating order (chapter 6).

    A machine whose load changes during the table slows every variant alike, instead of
    whichever ran while it was busy. One untimed run of each variant first warms it up and
    gives the result it computes. Each reading is helpers.timing.benchmark of whole runs.
    """
    rounds = positive_int(rounds, "rounds")
    for _, fixes in variants:
        _check_fixes(fixes)
    results = [train(cs, device, **fixes) for _, fixes in variants]
    seconds: list[list[float]] = [[] for _ in variants]
    states: list[list[MachineState]] = [[] for _ in variants]
    for r in range(rounds):
        for i in (j % len(variants) for j in range(r, r + len(variants))):
            fixes = variants[i][1]
            timing = benchmark(
                train, cs, device, device=device, warmup=0, min_run_time=min_run_time,
                min_repeats=1, **fixes,
            )  # fmt: skip
            seconds[i].append(timing.median / len(cs.perms))
            states[i].append(timing.machine)
    return [
        VariantTiming(name, fixes, seconds[i], results[i], merge_states(states[i]))
        for i, (name, fixes) in enumerate(variants)
    ]


def _row(
    timing: VariantTiming, slow: VariantTiming, previous: VariantTiming, cs: CaseStudy
) -> dict:
    """One row of the case-study table (chapter 6)."""
    result = timing.result
    if timing.fixes.get("big_batch"):
        same = _DIFFERENT_MATH.format(batch=cs.big_batch_size, steps=result.steps)
    else:
        same = "yes" if same_result(result, slow.result) else "NO"
    return {
        "variant": timing.name,
        "ms per epoch": timing.median * 1e3,
        "IQR (ms)": timing.iqr * 1e3,
        "speed-up vs previous": previous.median / timing.median,
        "speed-up vs slow": slow.median / timing.median,
        "final loss": result.epoch_losses[-1],
        "max |Δ param|": (result.params - slow.result.params).abs().max().item(),
        "same result as slow": same,
    }


@dataclass(repr=False)
class CaseStudyTable(Printed):
    """The case-study rows, the machine's state for each, and verdicts read from the rows (chapter 6)."""

    rows: list[dict[str, object]]
    states: list[MachineState | None]
    rounds: int

    @property
    def machine(self) -> MachineState | None:
        """The busiest state seen while any row was timed (chapter 6)."""
        return merge_states([s for s in self.states if s is not None])

    def compare(self, a: int, b: int) -> Verdict:
        """Row `a` against row `b` (indices), read from the rows by compare_rows, names translated (chapter 6)."""
        rows = _shown_rows(self.rows)
        states = [s for s in (self.states[a], self.states[b]) if s is not None]
        return compare_rows(
            rows, "variant", rows[a]["variant"], rows[b]["variant"], "ms per epoch",
            iqr="IQR (ms)", machine=states or None,
        )  # fmt: skip

    def verdicts(self) -> list[Verdict]:
        """Each row against the row before it: the ratio is the 'speed-up vs previous' column (chapter 6)."""
        return [self.compare(i, i - 1) for i in range(1, len(self.rows))]

    def __str__(self) -> str:
        machine = str(self.machine) if self.machine else tr("machine: unknown")
        return f"{format_table(_shown_rows(self.rows))}\n" + tr(
            "median and IQR of {rounds} interleaved rounds; {machine}"
        ).format(rounds=self.rounds, machine=machine)


def case_study_table(
    cs: CaseStudy, device: str | torch.device = "cpu", rounds: int = 5, min_run_time: float = 0.05
) -> CaseStudyTable:
    """Time every cumulative variant in interleaved rounds; speed-ups, spreads, same-result checks (chapter 6)."""
    timings = time_interleaved(cs, device, VARIANTS, rounds, min_run_time)
    rows = [_row(t, timings[0], timings[max(i - 1, 0)], cs) for i, t in enumerate(timings)]
    return CaseStudyTable(rows, [t.machine for t in timings], rounds)


def plot_case_study(rows: list[dict[str, object]]) -> Figure:
    """Horizontal bars of time per epoch for each variant, labelled with the speed-up (chapter 6)."""
    if not rows:
        raise ValueError(tr("No case-study rows to plot: run case_study_table() first."))
    names = [_shown_name(str(r["variant"])) for r in rows][::-1]
    ms = [float(r["ms per epoch"]) for r in rows][::-1]
    fig, ax = plt.subplots(figsize=(7.0, 0.55 * len(rows) + 1.2))
    bars = ax.barh(names, ms, color="tab:blue")
    ax.bar_label(bars, [f" {r['speed-up vs slow']:.1f}x" for r in rows[::-1]])
    ax.set_xlabel(tr("ms per epoch (median)"))
    ax.set_xlim(0, max(ms) * 1.2)
    ax.set_title(tr("Case study: each fix added to the previous ones"))
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def run_fixes(
    no_sync: bool = True,
    preprocess_once: bool = True,
    resident: bool = True,
    big_batch: bool = False,
    n_samples: int = 2048,
    device: str | torch.device = "cpu",
    rounds: int = 3,
) -> dict[str, object]:
    """Widget run: the slow loop and the chosen fixes in interleaved rounds, a verdict, same result? (chapter 6)."""
    cs = make_case_study(n_samples=n_samples)
    fixes = {"preprocess_once": preprocess_once, "resident": resident, "no_sync": no_sync}
    fixes["big_batch"] = big_batch  # the keys in the table's order (FIX_NAMES)
    variants = [("slow loop", {}), ("chosen fixes", fixes)]
    slow, fixed = time_interleaved(cs, device, variants, rounds, min_run_time=0.02)
    rows = [  # named in the learner's language: the verdict prints the names
        {"variant": tr(t.name), "ms": t.median * 1e3, "IQR (ms)": t.iqr * 1e3}
        for t in (slow, fixed)
    ]
    states = [s for s in (slow.machine, fixed.machine) if s is not None]
    verdict = compare_rows(
        rows, "variant", tr("chosen fixes"), tr("slow loop"), "ms", iqr="IQR (ms)",
        machine=states or None,
    )  # fmt: skip
    return {
        "chosen": [FIX_NAMES[k] for k, on in fixes.items() if on],
        "slow s": slow.median,
        "fixed s": fixed.median,
        "speed-up": slow.median / fixed.median,
        "verdict": verdict,
        "same result": None if big_batch else same_result(fixed.result, slow.result),
    }


def plot_fixes(result: dict[str, object]) -> Figure:
    """Widget plot: two bars, the slow loop and the chosen fixes, with the verdict (chapter 6)."""
    ms = [float(result["slow s"]) * 1e3, float(result["fixed s"]) * 1e3]
    label = "\n".join(tr(c) for c in result["chosen"]) or tr("no fixes")
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.bar([tr("slow loop"), label], ms, color=["tab:red", "tab:green"])
    title = tr("{verdict}; {same}").format(
        verdict=result["verdict"], same=tr(SAME_RESULT_WORDS[result["same result"]])
    )
    ax.set_title(wrap_title(title, 70), fontsize=9)
    ax.set_ylabel(tr("ms per epoch (median)"))
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
