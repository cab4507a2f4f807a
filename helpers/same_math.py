"""Same math, judged against the device's own noise: two loss curves compared step by step (chapter 7).

Two runs of one configuration, from the same weights on the same batches, differ only by what
the device does not repeat exactly (atomic additions in a GPU's backward kernels, say). A run
whose every initial weight was moved one ulp (the next float32 up) differs by fp32's own
rounding, carried through training. Step by step, the larger of the two gaps (and never less
than one ulp of the loss, the smallest difference a float32 loss can show) is the **noise
floor** of that configuration on this device.

A lever that computes the same math (the same kernels fed differently, or the same sums
added in another order) stays within a small multiple of that floor at every step; a change
of the math goes past it, sooner or later. How soon, this chapter measures with a negative
control (a learning rate 0.1% larger) on the learner's own device. On the course's 2-core CI
machine (2026-11-27, torch 2.13 CPU, 1 torch thread, other processes keeping 1.1 cores busy),
this chapter's CPU GPT gave: a learning rate 0.1% larger, 0.81x the tolerance at step 2 and
past it from step 3 (3.1x; 8.7x at step 8, 36x at step 24); 0.01% larger, within it for 8 steps
(0.84x at step 8) and past it from step 9; SDPA without its causal mask, 53x at step 1; SDPA
and fused AdamW themselves, at most one loss ulp (0.016x) in 24 steps. On a GPU the floor is
wider (atomic additions), so the step at which a change shows is the device's own: the
chapter prints it. tests/test_same_math_controls.py plants real bugs in the chapter's Trainer
(a tiny GPT, 8 steps): the causal mask dropped fails at step 1, the gradient clipping dropped
from step 4, while SDPA and fused AdamW stay within one loss ulp; and it shows what 8 steps
cannot see: attention's scale 10% off, on an initial attention that is nearly uniform.

The multiple is ``SAME_MATH_FACTOR`` = 64 = 2^6: half-way, in powers of two, between fp32's
rounding (unit roundoff 2^-24, what the floor measures) and TF32's, the next coarser format a
lever uses (2^-11, 2^13 times coarser).

This needs a training run whose small differences do not explode: with warm-up, a GPT-2-like
learning rate and gradient clipping (helpers.capstone.Regime), a one-ulp nudge stays at the
loss's ulp for dozens of steps; without them (the course's H100 run of 2026-11-26, lr 1e-3
from step 1) the loss spiked to 8.7 in 4 steps and ulp-level differences grew to 3e-3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from helpers.i18n import tr, tr_mark
from helpers.tables import screen_width
from helpers.units import Printed

#: How many times its noise floor a lever's loss gap may reach and still count as the same
#: math: 2^6, half-way (in powers of two) between fp32's unit roundoff and TF32's (2^13 apart).
SAME_MATH_FACTOR = 64.0
#: The row names of a check's per-step table (translated where it is printed).
_ROW_NAMES = (tr_mark("step"), tr_mark("gap"), tr_mark("tolerance"))


def loss_ulp(loss: float) -> float:
    """The gap between `loss` as a float32 and the next float32 up: the finest a loss can differ (chapter 7)."""
    x = torch.tensor(loss, dtype=torch.float32)
    return float(torch.nextafter(x, torch.tensor(math.inf)) - x)


def loss_gaps(a: list[float], b: list[float]) -> list[float]:
    """|a - b| step by step; a clear error when the curves have different lengths (chapter 7)."""
    if len(a) != len(b):
        raise ValueError(
            tr("The loss curves have {a} and {b} steps: compare runs of the same length.").format(
                a=len(a), b=len(b)
            )
        )
    return [abs(x - y) for x, y in zip(a, b)]


@dataclass(repr=False)
class NoiseFloor(Printed):
    """A configuration's noise floor per step: a rerun's gap, a one-ulp nudge's gap, the loss's ulp (chapter 7)."""

    label: str
    losses: list[float]
    rerun: list[float]
    nudged: list[float]

    @property
    def steps(self) -> int:
        """How many steps the floor covers (chapter 7)."""
        return len(self.losses)

    @property
    def per_step(self) -> list[float]:
        """The floor at each step: the largest of the three so far (a gap does not shrink for long) (chapter 7)."""
        floor, out = 0.0, []
        for loss, r, n in zip(self.losses, self.rerun, self.nudged):
            floor = max(floor, r, n, loss_ulp(loss))
            out.append(floor)
        return out

    def __str__(self) -> str:
        return tr(
            "noise floor of {label} over {steps} steps: a rerun differs by up to {rerun:.1e}, "
            "weights one ulp up by up to {nudged:.1e} (the loss's own ulp: {ulp:.1e})"
        ).format(
            label=self.label,
            steps=self.steps,
            rerun=max(self.rerun, default=0),
            nudged=max(self.nudged, default=0),
            ulp=loss_ulp(max(self.losses, default=0)),
        )


def noise_floor(
    label: str, losses: list[float], rerun: list[float], nudged: list[float]
) -> NoiseFloor:
    """The NoiseFloor of a run from its losses, a rerun's and a one-ulp-nudged run's (chapter 7)."""
    rerun_gaps, nudged_gaps = loss_gaps(rerun, losses), loss_gaps(nudged, losses)
    if not losses or not all(map(math.isfinite, losses + rerun + nudged)):
        raise ValueError(
            tr(
                "The runs of {label} must give finite losses for at least one step: a run "
                "that diverged has no noise floor."
            ).format(label=label)
        )
    return NoiseFloor(label, list(losses), rerun_gaps, nudged_gaps)


@dataclass(repr=False)
class SameMath(Printed):
    """Two loss curves compared step by step, against a noise floor, or why they were not (chapter 7)."""

    label: str
    gaps: list[float]
    floor: list[float] | None = None  # None: not checked (a change of rounding on purpose)
    note: str = ""
    factor: float = SAME_MATH_FACTOR
    steps_shown: int = field(default=16)
    error: str = ""  # why a check that the math needed could not run; '' when it ran

    @property
    def checked(self) -> bool:
        """Whether the gaps were held against a tolerance (chapter 7)."""
        return self.floor is not None

    @property
    def tolerance(self) -> list[float]:
        """The largest gap allowed at each step: factor x the noise floor (chapter 7)."""
        return [self.factor * f for f in self.floor or []]

    @property
    def passed(self) -> bool:
        """Every step within its tolerance, and the check ran where the math needed it (True when not checked on purpose) (chapter 7)."""
        return not self.error and all(g <= t for g, t in zip(self.gaps, self.tolerance))

    @property
    def first_over(self) -> int | None:
        """The first (1-based) step whose gap is past its tolerance, or None (chapter 7)."""
        over = [i for i, (g, t) in enumerate(zip(self.gaps, self.tolerance)) if g > t]
        return over[0] + 1 if over else None

    @property
    def worst(self) -> tuple[int, float]:
        """(1-based step, gap / tolerance) of the step closest to failing (chapter 7)."""
        ratios = [g / t for g, t in zip(self.gaps, self.tolerance)] or [0.0]
        step = max(range(len(ratios)), key=ratios.__getitem__)
        return step + 1, ratios[step]

    def verdict(self) -> str:
        """One line: same math or not, over how many steps, and by how much (chapter 7)."""
        n, largest = len(self.gaps), max(self.gaps, default=0.0)
        if self.error:
            return tr(
                "{label}: NOT CHECKED, and this lever must keep the math: the check could "
                "not run ({error})"
            ).format(label=self.label, error=self.error)
        if not self.checked:
            return tr(
                "{label}: {note}; largest gap over {n} steps {largest:.1e} (not checked)"
            ).format(label=self.label, note=self.note, n=n, largest=largest)
        step, ratio = self.worst
        if self.passed and largest == 0:  # "closest at 0x the tolerance" would say nothing
            return tr("{label}: bit-identical over {n} steps (every gap is 0)").format(
                label=self.label, n=n
            )
        if self.passed:
            return tr(
                "{label}: same math over {n} steps (largest gap {largest:.1e}; at its "
                "closest, step {step}, {ratio:.2g}x of the tolerance, {factor:g} x the "
                "noise floor)"
            ).format(
                label=self.label, n=n, largest=largest, step=step, ratio=ratio, factor=self.factor
            )
        return tr(
            "{label}: DIFFERENT: at step {step} the gap is {ratio:.3g}x the tolerance "
            "({factor:g} x the noise floor); {why}"
        ).format(
            label=self.label,
            step=step,
            ratio=ratio,
            factor=self.factor,
            why=self.note or tr("the math changed"),
        )

    def __str__(self) -> str:
        if not self.gaps:
            return self.verdict()
        rows = [("gap", self.gaps)] + ([("tolerance", self.tolerance)] if self.checked else [])
        shown = min(len(self.gaps), self.steps_shown)
        names = {name: tr(name) for name in _ROW_NAMES}
        width = max(10, *(screen_width(n) for n in names.values()))

        def cell(name: str) -> str:  # padded to the same screen width, Chinese included
            return "  " + names[name] + " " * (width - screen_width(names[name]) + 1)

        lines = [self.verdict(), cell("step") + " ".join(f"{i:>7d}" for i in range(1, shown + 1))]
        for name, values in rows:
            lines.append(cell(name) + " ".join(f"{v:7.1e}" for v in values[:shown]))
        if len(self.gaps) > shown:
            lines.append("  " + tr("... {n} more steps").format(n=len(self.gaps) - shown))
        return "\n".join(lines)

    def check(self) -> SameMath:
        """Raise AssertionError (with the per-step table) unless passed, or if a check the math needed did not run; return self (chapter 7)."""
        if not self.passed:
            raise AssertionError(str(self))
        return self

    def as_control(self) -> str:
        """One line for a change of the math made on purpose: whether, and from which step, the check sees it (chapter 7)."""
        if not self.checked:
            raise ValueError(
                tr("{label}: a control needs a noise floor to be held against.").format(
                    label=self.label
                )
            )
        step, ratio = self.worst
        n = len(self.gaps)
        what = self.note or tr("it")
        if self.first_over is None and max(self.gaps, default=0.0) == 0:
            return tr(
                "{label}: bit-identical over all {n} steps (every gap is 0): this check "
                "cannot tell {what} from this device's noise"
            ).format(label=self.label, n=n, what=what)
        if self.first_over is None:
            return tr(
                "{label}: within the tolerance over all {n} steps (closest at step {step}, "
                "{ratio:.2g}x the tolerance): over {n} steps this check cannot tell "
                "{what} from this device's noise"
            ).format(label=self.label, n=n, step=step, ratio=ratio, what=what)
        return tr(
            "{label}: past the tolerance from step {first} of {n} (worst: step "
            "{step}, {ratio:.3g}x the tolerance, {factor:g} x the noise floor): the "
            "check sees {what}"
        ).format(
            label=self.label,
            first=self.first_over,
            n=n,
            step=step,
            ratio=ratio,
            factor=self.factor,
            what=what,
        )


def check_not_run(label: str, error: str) -> SameMath:
    """A same-math check that the math needed and that could not run: it fails, with the reason (chapter 7)."""
    return SameMath(label, [], None, error=error or tr("no reason given"))


def same_math(
    label: str,
    losses: list[float],
    reference: list[float],
    floor: NoiseFloor | None,
    note: str = "",
) -> SameMath:
    """`losses` against `reference` step by step, held to factor x `floor` (None: printed only) (chapter 7)."""
    gaps = loss_gaps(losses, reference)
    if floor is None:
        return SameMath(label, gaps, None, note)
    if floor.steps < len(gaps):
        raise ValueError(
            tr(
                "The noise floor covers {floor} steps and the curves {n}: "
                "measure the floor over at least as many steps as you compare."
            ).format(floor=floor.steps, n=len(gaps))
        )
    return SameMath(label, gaps, floor.per_step[: len(gaps)], note)
