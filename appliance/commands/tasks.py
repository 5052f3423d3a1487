"""`autotune tasks`: list the kernel tasks."""

from __future__ import annotations

import click

from appliance.commands.options import (
    JSON,
)
from appliance.output import (
    emit_json,
)


@click.command()
@JSON
def tasks(as_json: bool) -> None:
    """List the kernel tasks, their shapes, peers and shipped candidates."""
    from loop.tasks import available_tasks, load_task

    rows = []
    for name in available_tasks():
        t = load_task(name)
        rows.append(
            {
                "task": name,
                "folder": str(t.folder),
                "peers": list(t.peers),
                "candidates": t.candidates,
                "shapes": {d: [s.name for s in t.shapes(d)] for d in ("cuda", "cpu")},
            }
        )
    if as_json:
        emit_json(rows)
        return
    for row in rows:
        click.echo(
            f"{row['task']}: peers {', '.join(row['peers'])}; candidates {row['candidates']}; {len(row['shapes']['cuda'])} GPU / {len(row['shapes']['cpu'])} CPU shapes"
        )
