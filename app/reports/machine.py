"""What a report says about where and how it was made: date, command line, machine."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def command_line(words: list[str]) -> str:
    return "tandem " + " ".join(shlex.quote(w) for w in words)


def run_context(command: str) -> dict:
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command,
        "machine": f"{platform.system()} {platform.machine()}, {_cpu_model()}, "
                   f"{os.cpu_count()} logical CPUs",
        "python": platform.python_version(),
    }
