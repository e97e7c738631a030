#!/usr/bin/env python3
"""A shell for make that records what each recipe line cost: `make SHELL=bench/stage_shell.py ...`.

Runs every command as /bin/sh would (`stage_shell.py -c COMMAND`) and, where FARMKIT_STAGE_LOG names
a file, appends one JSON line to it: the command, its wall seconds and the user and system CPU
seconds of every process it ran (resource.getrusage(RUSAGE_CHILDREN): the tool and whatever it
started and waited for, every thread included). Under make -j each recipe line has a shell of its
own, so lines that ran side by side are counted apart. bench/stage_profile.py reads the log.
Standard library only: it runs before any environment is chosen.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    code = subprocess.call(["/bin/sh", *argv])
    wall = time.perf_counter() - started
    log = os.environ.get("FARMKIT_STAGE_LOG")
    command = argv[-1] if argv else ""
    if log and argv[:1] == ["-c"]:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        line = json.dumps(
            {
                "command": command,
                "cwd": os.getcwd(),
                "exit": code,
                "wall_s": round(wall, 3),
                "user_s": round(usage.ru_utime, 3),
                "sys_s": round(usage.ru_stime, 3),
            }
        )
        # one write of one line, appended: lines from shells running side by side do not interleave
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
