"""stdout carries records only: whatever a library prints while a farm-* command runs goes to stderr."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import orjson

NOISY_TOOL = textwrap.dedent(
    """
    import logging, os, sys
    import click
    from farmkit.cli import common_options, entry_point
    from farmkit.core.io import RecordWriter

    # a library that bound a logging handler to sys.stdout when it was imported (DeepSpeed does)
    early = logging.getLogger("early-library")
    early.addHandler(logging.StreamHandler(sys.stdout))
    early.setLevel(logging.INFO)

    @click.command()
    @common_options
    def cli():
        early.info("[WARNING] Setting accelerator to CPU")
        print("a library's print()")
        os.write(1, b"C code writing to fd 1\\n")
        late = logging.getLogger("late-library")
        late.addHandler(logging.StreamHandler(sys.stdout))
        late.warning("a handler bound while the command runs")
        with RecordWriter() as writer:
            for index in range(3):
                writer.write({"index": index})

    entry_point(cli)()
    """
)


def test_library_output_goes_to_stderr_not_between_records(tmp_path):
    script = tmp_path / "noisy.py"
    script.write_text(NOISY_TOOL)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert [orjson.loads(line) for line in lines] == [{"index": 0}, {"index": 1}, {"index": 2}]
    stderr = done.stderr.decode()
    for noise in (
        "Setting accelerator to CPU",
        "a library's print()",
        "C code writing to fd 1",
        "a handler bound while the command runs",
    ):
        assert noise in stderr


def test_closed_pipe_stays_quiet_with_rerouted_stdout(tmp_path):
    records = tmp_path / "many.jsonl"
    records.write_text("".join(f'{{"instruction": "item {i}"}}\n' for i in range(20000)))
    shell = f"{sys.executable} -m farmkit.tools.farm_split --tag {records} | head -1"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    assert len(done.stdout.decode().splitlines()) == 1
    assert b"Traceback" not in done.stderr and b"Broken pipe" not in done.stderr
