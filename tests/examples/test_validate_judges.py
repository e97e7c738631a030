"""`make -C examples validate-judges` on a small sample of PandaLM's human-labelled pairs with the
offline pools: the recipe prints farm-correlate's markdown table with one row per pool, agreements
in [0, 1], the flip rate counted on the swapped copies, and says it skipped when the data is absent."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, shared_data

pytestmark = pytest.mark.recipe

EXAMPLES = ROOT / "examples"


def _make(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(EXAMPLES), "validate-judges",
         f"PYTHON={sys.executable}", f"OUT={tmp_path / 'run'}",
         f"VALIDATE_OUT={tmp_path / 'validate'}", *args],
        capture_output=True, text=True, timeout=600, env=env, check=True,
    )  # fmt: skip


# the first markdown table: the judges' statistics (the agreement tables follow it after a blank line)
def _table(stdout: str) -> dict[str, dict[str, str]]:
    text = stdout[stdout.index("\n|") + 1 :] if not stdout.startswith("|") else stdout
    lines = list(itertools.takewhile(lambda line: line.startswith("|"), text.splitlines()))
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [
        dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=False))
        for line in lines[2:]
    ]
    return {row["annotator"]: row for row in rows}


def test_validate_judges_table(tmp_path):
    humans = shared_data("human_prefs/pandalm_testset_v1.json")
    done = _make(tmp_path, f"HUMANS={humans}", "POOL=gold sim_ann_offline", "VALIDATE_N=40")
    table = _table(done.stdout)
    assert {"gold", "sim_ann_offline", "humans"} <= set(table)
    for pool in ("gold", "sim_ann_offline"):
        row = table[pool]
        assert row["n_pairs"] == "80"  # 40 pairs, each in both orders
        for column in ("human_agreement", "human_agreement_alpacaeval", "flip_rate"):
            assert 0 <= float(row[column]) <= 1
    # the gold heuristic is deterministic and blind to the order; the noisy pool flips
    assert float(table["gold"]["flip_rate"]) == 0
    assert float(table["sim_ann_offline"]["flip_rate"]) > 0
    assert float(table["humans"]["human_agreement"]) > 0.5


def test_validate_judges_skips_without_data(tmp_path):
    done = _make(tmp_path, f"HUMANS={tmp_path / 'absent.json'}", "POOL=gold")
    assert "no human labels" in done.stdout and "skipped" in done.stdout
    assert not (tmp_path / "validate").exists()
