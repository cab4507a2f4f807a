"""gpu_check's report: the summary in Markdown, one section per part (gpu_check)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from gpucheck.common import ROOT, fenced, md_cell
from gpucheck.machine import command_output, gpu_summary, machine_markdown, states_markdown
from gpucheck.plan import BUDGET_S, STAGES, Item


@dataclass
class Part:
    """One part's outcome: its Markdown section, and whether it passed, failed or was skipped."""

    name: str
    status: str  # "ok", "FAILED", "skipped", "not run" or "incomplete"
    markdown: str
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def git_commit() -> str:
    """'abc1234 (tree def5678)', with '+ local changes' when the tree is dirty ('' without git).

    The tree's hash depends only on the files: a copy of the checkout committed elsewhere (as
    the device tool's copy on a lent GPU machine) has another commit but the same tree, and
    `git rev-parse COMMIT^{tree}` here finds which commit that was.
    """
    sha = command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    if not sha:
        return ""
    tree = command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD^{tree}"])
    dirty = command_output(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]
    )
    return sha + (f" (tree {tree})" if tree else "") + (" + local changes" if dirty else "")


def part_status(items: list[Item]) -> str:
    """ok, FAILED, skipped, not run or incomplete, from the part's items."""
    if any(i.status == "FAILED" for i in items):
        return "FAILED"
    if all(i.status == "skipped" for i in items):
        return "skipped"
    if all(i.status in ("not run", "pending") for i in items):
        return "not run"
    if any(i.status in ("not run", "pending", "STOPPED") for i in items):
        return "incomplete"  # stopped by a deadline or a signal: neither passed nor failed
    return "ok"


def tracebacks(items: list[Item]) -> str:
    """The tracebacks of errors that were not a test's or a cell's, one block each."""
    blocks = [
        f"Traceback of {i.name} (not a cell's or a test's error):\n\n"
        + fenced(i.traceback.rstrip("\n"))
        for i in items
        if i.traceback
    ]
    return "\n" + "\n".join(blocks) if blocks else ""


def notebooks_markdown(items: list[Item], out: Path) -> str:
    lines = ["| notebook | result | seconds | stream |", "|---|---|---:|---:|"]
    lines += [
        f"| {i.name} | {md_cell(i.result())} | {i.seconds:.1f} | {i.stream or '-'} |" for i in items
    ]
    ran = [i for i in items if i.status not in ("not run", "pending")]
    failed = sum(i.status == "FAILED" for i in ran)
    stopped = sum(i.status == "STOPPED" for i in ran)
    streams = len({i.stream for i in ran if i.stream})
    lines += [
        "",
        f"{len(ran)} notebooks, {failed} failed"
        + (f", {stopped} stopped" if stopped else "")
        + f", {sum(i.seconds for i in ran):.0f} s in all "
        f"(each through `tools/run_all.py NOTEBOOK --no-describe` in a fresh kernel, "
        + (f"{streams} streams side by side: shared timings" if streams > 1 else "one at a time")
        + "; executed copies and kernel logs in `notebooks/`)."
        + (f" {len(items) - len(ran)} not run." if len(ran) < len(items) else ""),
    ]
    return "\n".join(lines) + "\n" + tracebacks(items)


def benchmarks_markdown(items: list[Item]) -> str:
    ran = [i.markdown for i in items if i.markdown]
    rest = [f"- {i.name}: {i.result()}" for i in items if not i.markdown]
    text = "\n".join(ran) or "No benchmark ran.\n"
    return text + ("\n" + "\n".join(rest) + "\n" if rest else "") + tracebacks(items)


def tests_markdown(items: list[Item]) -> str:
    (item,) = items
    if not item.markdown:
        return f"Tests: {item.result()}.\n" + tracebacks(items)
    carried = f"Carried over: {item.result()}.\n\n" if item.earlier else ""
    return carried + item.markdown + tracebacks(items)


def nccl_markdown(items: list[Item]) -> str:
    if len(items) == 1 and items[0].status == "skipped":
        return f"Skipped: {items[0].detail}.\n"
    rows = []
    for i in items:
        script, world = i.name.rsplit(" x", 1)
        rows.append(f"| {script} | {world} | {md_cell(i.result())} | {i.seconds:.1f} |")
    text = "| script | GPUs (ranks) | result | seconds |\n|---|---:|---|---:|\n"
    text += "\n".join(rows) + "\n\nBackend nccl, one rank per GPU, through "
    text += "`helpers.launch.launch` (torchrun); logs in `nccl/`.\n"
    return text + tracebacks(items)


def parts_of(check: object) -> list[Part]:
    """One Part per --only part that has items, in PARTS order."""
    show = {
        "notebooks": lambda items: notebooks_markdown(items, check.out),
        "tests": tests_markdown,
        "benchmarks": benchmarks_markdown,
        "nccl": nccl_markdown,
    }
    parts = []
    for name in dict.fromkeys(STAGES.values()):  # in the order they run
        items = [i for i in check.items if i.part == name]
        if not items:
            continue
        problems = []
        for i in items:
            if i.status in ("FAILED", "STOPPED"):
                problems += i.problems or [f"{i.name}: {i.result()}"]
        seconds = sum(i.seconds for i in items)
        parts.append(Part(name, part_status(items), show[name](items), seconds, problems))
    return parts


def summary(check: object) -> str:
    """The whole report as Markdown."""
    parts = parts_of(check)
    failed = [p for p in parts if p.status == "FAILED"]
    stopped = [i for i in check.items if i.status == "STOPPED"]
    not_run = [i for i in check.items if i.status in ("not run", "pending")]
    if check.running:
        state = f"still running ({'; '.join(sorted(check.running.values()))})"
    elif failed or any("gpu_check itself failed" in n for n in check.notes):
        state = "FAILED"
    elif stopped or not_run or check.stopped:
        state = f"incomplete, {len(stopped)} item(s) stopped, {len(not_run)} not run"
    else:
        state = "passed"
    commit = git_commit()
    command = shlex.join(["python", "tools/gpu_check.py", *check.argv])
    deadline = (
        f"; deadline {check.args.deadline:g} s, {check.elapsed():.0f} s used"
        if check.args.deadline
        else ""
    )
    lines = [
        f"# GPU check: {gpu_summary(check.machine)}",
        "",
        f"Started {check.started}"
        + (f", commit {commit}" if commit else "")
        + f": `{command}`{deadline}",
        "",
        f"**Result: {state}.** "
        + "; ".join(f"{p.name}: {p.status} ({p.seconds:.0f} s)" for p in parts),
        "",
    ]
    if check.stopped:
        lines += [f"- {check.stopped}"]
    for p in parts:
        if p.status in ("FAILED", "incomplete"):
            lines += [f"- {p.name}: {md_cell(x)}" for x in p.problems]
    if failed or stopped or check.stopped:
        lines.append("")
    lines += check.notes + ([""] if check.notes else [])
    lines += [how_it_ran(check), ""]
    lines += ["## Machine", "", machine_markdown(check.machine)]
    cores = int(check.machine.get("cores") or 1)
    lines += ["## Machine state", "", states_markdown(check.states, cores)]
    for p in parts:
        lines += [f"## {p.name.capitalize() if p.name != 'nccl' else 'NCCL'}", "", p.markdown]
    if not_run:
        lines += ["## Not run", ""]
        lines += [f"- {i.stage}: {i.name}: {i.detail or 'not reached'}" for i in not_run]
        used = check.elapsed()
        budget = (
            f" With a {BUDGET_S:g} s rental this call used {used:.0f} s: give the next call "
            f"`--deadline {max(BUDGET_S - used, 0):.0f}`."
            if check.args.deadline
            else ""
        )
        lines += [
            "",
            "To run them, call again with `--resume` and this run's folder (README, 'GPU check')."
            + budget,
            "",
        ]
    logs = log_names(check.out)
    if logs:
        lines += ["## Logs", "", "Beside this file: " + ", ".join(f"`{x}`" for x in logs) + ".", ""]
    return "\n".join(lines)


def log_names(out: Path) -> list[str]:
    """The logs and folders a run left in `out` (the summary lists them)."""
    names = ["machine.json", "progress.json", "notebooks.log"]
    names += sorted(p.name for p in out.glob("notebooks-stream*.log"))
    names += ["notebooks/", "tests.log", "tests.xml", "failures.txt", "benchmarks/", "nccl/"]
    return [n for n in names if (out / n.rstrip("/")).exists()]


def how_it_ran(check: object) -> str:
    """What the two phases were: the streams and their threads, and which timings are shared."""
    ran = [i for i in check.items if i.status != "skipped"]
    parts = [
        p
        for p in ("notebooks", "unit tests", "NCCL")
        if any(
            {"notebooks": "notebooks", "unit tests": "tests", "NCCL": "nccl"}[p] == i.part
            for i in ran
        )
    ]
    text = []
    if any(i.phase == "correctness" for i in ran):
        what = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
        shared = "shared-GPU, shared-CPU" if check.machine.get("gpu_count") else "shared-CPU"
        text.append(
            (
                f"**Correctness phase**: {what} in {check.streams} streams side by side, each "
                f"with {check.threads} thread(s)"
                if check.streams > 1
                else f"**Correctness phase**: {what} one after the other, in one stream of "
                f"{check.threads} thread(s)"
            )
            + " for torch, OpenMP and MKL (usable cores / streams)"
            + (
                f": its times are {shared} times, not this machine's speed."
                if check.streams > 1
                else "."
            )
        )
    if any(i.phase == "timing" for i in ran):
        a = check.args
        which = (
            "the ones given (--benchmarks)"
            if a.benchmarks
            else "every benchmark in full (--full-benchmarks)"
            if a.full_benchmarks
            else "the headline ones, shortened (--quick)"
            if a.quick
            else "the headline ones; --full-benchmarks runs every benchmark in full"
        )
        text.append(
            f"**Timing phase**: the benchmarks one at a time, alone on the machine ({which})."
        )
    return " ".join(text)
