"""
What every benchmark shares: the machine's description, order statistics,
markdown tables, CPU pinning and process CPU time, and the settings a
benchmark's middleware starts from.
"""

from __future__ import annotations

import atexit
import os
import platform
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rpmiddleware.config.settings import Settings


def cpuModel() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> str:
    import autobahn

    import twisted

    return (
        f"{os.cpu_count()} CPUs ({cpuModel()}), {platform.system()} {platform.release()}, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"Twisted {twisted.__version__}, Autobahn {autobahn.__version__}"
    )


def percentile(values: Sequence[float], p: float) -> float:
    """
    The C{p}-th percentile (0-100), nearest rank.
    """
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def percentileMs(values: Sequence[float], p: float) -> float:
    """
    L{percentile} of C{values} in seconds, in milliseconds.
    """
    return percentile(values, p) * 1000


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |"]
    lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|")
    for row in rows:
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines)


@dataclass
class Section:
    """
    One benchmark's part of docs/benchmarks.md.
    """

    title: str
    body: str
    #: (goal, measured, met) for the summary at the top.
    goals: list[tuple[str, str, bool]] = field(default_factory=list)
    #: The benchmark (``python -m bench NAME``) that made it.
    source: str = ""
    #: When it was measured (UTC), shown with it.
    measured: str = ""
    #: Issue 20's summary figures: name -> (the relay's, the middleware's, unit).
    figures: dict[str, tuple[float, float, str]] = field(default_factory=dict)

    def markdown(self) -> str:
        mark = f"<!-- bench: {self.source} -->\n" if self.source else ""
        when = f"*Measured {self.measured} UTC.*\n\n" if self.measured else ""
        return f"## {self.title}\n{mark}\n{when}{self.body.strip()}\n"


def pin(cpu: int) -> None:
    """
    Run this process on one CPU (where the system allows it).
    """
    count = os.cpu_count() or 1
    try:
        os.sched_setaffinity(0, {cpu % count})
    except (AttributeError, OSError):
        pass


def processCpu(pid: int) -> float:
    """
    CPU seconds (user + system) a process has used, from /proc.
    """
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


_scratch: list[str] = []


def scratchFolder() -> str:
    """
    A folder of this run's own, removed when it ends: what the middleware
    keeps on disk (the memory plugin's store, made at start-up) goes there,
    never into the folder the benchmark was started from.
    """
    if not _scratch:
        folder = tempfile.mkdtemp(prefix="rpmiddleware-bench-")
        atexit.register(shutil.rmtree, folder, True)
        _scratch.append(folder)
    return _scratch[0]


def benchSettings() -> Settings:
    """
    The default settings, but for the memory store, kept in L{scratchFolder}
    (a store on disk, as a daemon has, and a new one each run).
    """
    from rpmiddleware.config.settings import Settings

    settings = Settings()
    settings.plugins["memory"] = {"path": os.path.join(scratchFolder(), "memory.sqlite3")}
    return settings
