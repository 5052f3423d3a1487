"""Run one job per host, each in its own thread; a host that fails is a result, not an
exception, and never stops the others."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from appliance.fleet.connection import HostFailure
from appliance.fleet.inventory import Host


@dataclass
class HostResult:
    """What one host answered: status "ok" or why not (see connection.STATUSES)."""

    host: str
    status: str
    reason: str = ""
    data: Any = None
    exit_code: int | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "status": self.status,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
            "data": self.data,
        }


Job = Callable[[Host], HostResult]


def for_each_host(
    hosts: list[Host], job: Job, on_done: Callable[[HostResult], None] | None = None
) -> list[HostResult]:
    """Run `job` for every host at once; results come back in the hosts' order."""
    results: dict[str, HostResult] = {}
    with ThreadPoolExecutor(max_workers=max(1, len(hosts)), thread_name_prefix="fleet") as pool:
        futures = {pool.submit(_guarded, job, host): host for host in hosts}
        for future in as_completed(futures):
            result = future.result()
            results[result.host] = result
            if on_done is not None:
                on_done(result)
    return [results[h.name] for h in hosts]


def _guarded(job: Job, host: Host) -> HostResult:
    start = time.monotonic()
    try:
        result = job(host)
    except HostFailure as exc:
        result = HostResult(host.name, exc.status, exc.reason, exit_code=exc.exit_code)
    except Exception as exc:  # one host's bug must not take the fleet down
        result = HostResult(host.name, "error", f"{type(exc).__name__}: {exc}")
    result.seconds = time.monotonic() - start
    return result
