"""Progress for long work: the loop's events as a rich progress bar and log lines, and the table
of the loop's final per-shape comparison."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from appliance.output import console, fmt_time


def progress_bar() -> Progress:
    """The appliance's one progress bar: description, bar, done/total, elapsed; gone when done."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


@contextmanager
def loop_progress(quiet: bool = False, note: str = "") -> Iterator:
    """Yields an `on_event(kind, data)` callback for `loop.driver.run_loop`."""
    if quiet:
        yield lambda kind, data: None
        return
    if note:
        console.print(note)
    progress = progress_bar()
    bar = {"id": None}

    def on_event(kind: str, data: dict) -> None:
        if kind == "calibrate":
            console.print("  calibrating noise: incumbent against itself (A/A)")
        elif kind == "calibrated":
            console.print(
                f"  noise floor {data['noise_floor'] * 100:.2f} % "
                f"(A/A ratio {data['ratio']:.4f} [{data['ci_low']:.4f}, {data['ci_high']:.4f}])"
            )
        elif kind == "requeued":
            console.print(f"  resumed: re-queued interrupted trials {data['params']}")
        elif kind == "trial":
            if bar["id"] is None:
                bar["id"] = progress.add_task("trials", total=data["total"], completed=data["done"])
            progress.update(bar["id"], description=f"trial {data['number']} {data['params']}")
        elif kind == "trial-done":
            sp = data.get("speedup")
            text = f"{sp['ratio']:.3f}x [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}]" if sp else ""
            # a trial without a reason code (an agent that did not start) shows its message
            why = ", ".join(data.get("reasons") or data.get("messages", [])[:1])
            progress.console.print(f"  trial {data['number']}: {data['status']} {text} {why}")
            if bar["id"] is not None:
                progress.advance(bar["id"])
        elif kind == "final":
            console.print(f"  final: incumbent {data['params']} against the peers")

    with progress:
        yield on_event


def render_final_table(result) -> Table:
    table = Table(
        title=f"{result.task}: {result.candidate.rsplit('/', 1)[-1]} {result.incumbent['params']}"
    )
    for col in ("shape", "tuned", "best peer", "speedup [95% CI]", "dispatch"):
        table.add_column(col)
    for row in result.final:
        sp = row["speedup_vs_best_peer"]
        peer = row["best_peer"]
        table.add_row(
            row["shape"],
            fmt_time(row["candidate"]["median_s"]),
            f"{peer} {fmt_time(row['peers'][peer]['median_s'])}" if peer else "-",
            f"{sp['ratio']:.3f}x [{sp['ci_low']:.3f}, {sp['ci_high']:.3f}]" if sp else "-",
            row["winner"],
        )
    return table
