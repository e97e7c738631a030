"""farmkit.core.allocator: the tools keep freed memory in the process (glibc's mallopt), so that torch's
large, short-lived CPU tensors are not mapped anew, page by page, on every step."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from farmkit.core import allocator

# a block of 64 MiB (far above glibc's largest default mmap threshold, 32 MiB) written, then freed,
# ten times: the minor page faults that cost, in a fresh process
FAULTS = """
import ctypes, resource, sys
from farmkit.core.allocator import keep_freed_memory
took = keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

linux_glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"),
    reason="glibc's allocator only",
)


def faults(**env: str) -> tuple[bool, int]:
    clean = {k: v for k, v in os.environ.items() if k not in allocator.USER_SETTINGS}
    clean.pop("FARMKIT_KEEP_FREED_MEMORY", None)
    done = subprocess.run(
        [sys.executable, "-c", FAULTS],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    took, count = done.stdout.split()
    return took == "True", int(count)


@linux_glibc
def test_freed_memory_is_reused_without_new_page_faults():
    took, kept = faults()
    off, default = faults(FARMKIT_KEEP_FREED_MEMORY="0")
    assert took and not off
    pages = 10 * (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    # by default every round maps the block anew: a fault per page, every time
    assert default >= 0.9 * pages, (default, pages)
    # kept: the first round's pages are the only ones faulted in
    assert kept <= 0.2 * pages, (kept, pages)


@linux_glibc
def test_the_users_own_allocator_settings_are_left_alone():
    took, count = faults(MALLOC_MMAP_THRESHOLD_=str(1 << 20))
    assert not took
    pages = 10 * (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert count >= 0.9 * pages


def test_every_tool_keeps_freed_memory(monkeypatch, tmp_path):
    from farmkit.tools.farm_split import cli

    from farmkit import cli as farmkit_cli

    called = []
    monkeypatch.setattr(farmkit_cli, "keep_freed_memory", lambda: called.append(1))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"instruction": "q{i}", "output": "a"}}\n' for i in range(4)))
    result = CliRunner().invoke(
        cli, [str(data), "-o", str(tmp_path / "out"), "--sizes", "a=2,b=2", "-q"]
    )
    assert result.exit_code == 0, result.output
    assert called == [1]
