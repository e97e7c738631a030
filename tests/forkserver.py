"""Start the farm-* tools of the tests as forks of a process that has imported torch, transformers
and the trainers' libraries (peft, TRL).

Every tool that loads a model spends about 2.5 s of CPU importing torch and transformers before it
does anything (and a trainer 3.5 s more for peft and TRL), and the suite starts hundreds of them. So `run_tool` (conftest.py) and the recipes
that the tests run through make (a `farm-*` shim first on their PATH, `shim_folder()`) ask a fork
server, one per pytest process, for a child forked from an interpreter that imported those libraries
once. The child runs the tool's console-script entry point as its own process: its own pid, argv,
environment, working directory, stdin, stdout, stderr and exit status. What the tool does after its
imports is unchanged; the fork skips only importing libraries that the tool would import anyway.

A tool starts fresh instead (a plain exec, as before) wherever a fork could differ from it:
- the server's own imports printed anything or raised a warning (a fresh tool would print it too);
- the caller's environment differs from the server's in a variable that those libraries, OpenMP or
  Python may read while they are imported or while an interpreter starts (HF_*, TRANSFORMERS*,
  TORCH*, OMP_*, PYTHON*, HOME, LANG, TMPDIR, ...: IMPORT_PREFIXES and IMPORT_NAMES below); the
  rest (FARMKIT_*, OPENAI_*, PATH, a recipe's make variables) is read when the tool runs;
- FARMKIT_TEST_FORK=0 is set (every tool then starts fresh, as before).

Tests that are about starting a process (imports, a launcher, kill -9, several processes at once)
start their processes with subprocess directly, not through run_tool.
"""

from __future__ import annotations

import array
import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import orjson

# Variables that torch, transformers, huggingface_hub, OpenMP or Python itself may read while the
# server imports them (or that are fixed when an interpreter starts): a difference in any of them
# starts the tool fresh. Everything else (FARMKIT_*, OPENAI_*, PATH, a recipe's make variables) is
# read when the tool runs, in the child, where it is already the caller's.
IMPORT_PREFIXES = (
    "HF_",
    "HUGGINGFACE",
    "TRANSFORMERS",
    "TORCH",
    "PYTORCH",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS",
    "CUDA",
    "NCCL",
    "TOKENIZERS",
    "SAFETENSORS",
    "DATASETS",
    "ACCELERATE",
    "TRITON",
    "XDG_",
    "PYTHON",
    "LD_",
    "LC_",
    "SSL_",
    "TQDM",
)
IMPORT_NAMES = {
    "HOME",
    "LANG",
    "LANGUAGE",
    "TMPDIR",
    "TEMP",
    "TMP",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
}
RUNTIME_NAMES = {"PYTHON"}  # the recipes' interpreter for their scripts, not a Python variable
MESSAGE = 1 << 20

# The server: import the heavy libraries, recording warnings and output; say whether it was silent;
# then fork a child per connection. The child reads the request and its three files, says its pid,
# runs the tool, and sends its exit status before it exits.
SERVER = r"""
import io, os, signal, socket, sys, warnings, array
import orjson
said = io.StringIO()
real_stdout, real_stderr = sys.stdout, sys.stderr
sys.stdout = sys.stderr = said
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    import transformers
    import transformers.modeling_utils
    import transformers.models.llama.modeling_llama
    import transformers.models.auto.modeling_auto
    import transformers.tokenization_utils_fast
    # the trainers' libraries (farm-sft, farm-dpo and the tools built on them): about 3.5 s of CPU a
    # tool, most of it peft's import of transformers' model classes
    try:
        import transformers.trainer
        import peft
        import trl
        from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer
    except ImportError:  # an environment without the ml extra's trainers: the tools import less
        pass
sys.stdout, sys.stderr = real_stdout, real_stderr
listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
listener.bind(sys.argv[1])
listener.listen(16)
hello = socket.socket(fileno=int(sys.argv[2]))
hello.send(orjson.dumps({"clean": not caught and not said.getvalue(), "said": said.getvalue()[-2000:]}))
hello.close()
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped as they end


def child(connection):
    import atexit, threading
    from importlib.metadata import entry_points

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    listener.close()
    fds = array.array("i")
    message, ancillary, _, _ = connection.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    request = orjson.loads(message)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    connection.send(orjson.dumps({"pid": os.getpid()}))
    name = os.path.basename(sys.argv[0])
    code = 0
    try:
        (entry,) = [e for e in entry_points(group="console_scripts") if e.name == name]
        result = entry.load()()
        code = result if isinstance(result, int) else (0 if result is None else 1)
    except SystemExit as exit:
        if exit.code is None:
            code = 0
        elif isinstance(exit.code, int):
            code = exit.code
        else:
            print(exit.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        connection.send(orjson.dumps({"status": code & 0xFF}))
    finally:
        os._exit(code & 0xFF)


while True:
    try:
        connection, _ = listener.accept()
    except OSError:
        break
    if os.fork() == 0:
        try:
            child(connection)
        finally:
            os._exit(1)
    connection.close()
"""


class ForkServer:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.folder = tempfile.mkdtemp(prefix="farm-fork-")
        self.address = os.path.join(self.folder, "server")
        self.env = dict(os.environ if env is None else env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # its own output goes to a file (never the pytest worker's stdout, which xdist talks over):
        # anything written there while importing, even below Python, makes the server unusable
        log = Path(self.folder) / "server.log"
        with open(log, "wb") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-c", SERVER, self.address, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                env=self.env,
            )
        theirs.close()
        hello = ours.recv(MESSAGE)
        ours.close()
        self.usable = (
            bool(hello) and bool(orjson.loads(hello).get("clean")) and log.stat().st_size == 0
        )

    def import_env(self) -> dict[str, str]:
        """The server's variables that could matter to its imports (no keys: none of those match)."""
        return {name: value for name, value in self.env.items() if _at_import(name)}

    def same_imports(self, env: dict[str, str]) -> bool:
        """True when env and the server's agree on every variable that could matter to an import."""
        return same_imports(env, self.env)

    def run(
        self,
        argv: list[str],
        input: bytes | None,
        env: dict[str, str],
        timeout: float,
        started: Callable[[int], None] | None = None,
    ) -> subprocess.CompletedProcess:
        """Run argv in a child; `started` is called with the child's pid as soon as it exists (a
        test that SIGKILLs the tool at a moment of its own choosing)."""
        with tempfile.TemporaryDirectory(prefix="farm-fork-run-") as folder:
            stdin = Path(folder) / "stdin"
            stdin.write_bytes(input or b"")
            files = [
                os.open(stdin if input is not None else os.devnull, os.O_RDONLY),
                os.open(Path(folder) / "stdout", os.O_WRONLY | os.O_CREAT, 0o600),
                os.open(Path(folder) / "stderr", os.O_WRONLY | os.O_CREAT, 0o600),
            ]
            killed = threading.Event()
            try:
                status = start(self.address, argv, env, files, timeout, killed, started=started)
            finally:
                for fd in files:
                    os.close(fd)
            stdout = (Path(folder) / "stdout").read_bytes()
            stderr = (Path(folder) / "stderr").read_bytes()
        if killed.is_set():
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
        return subprocess.CompletedProcess(argv, status, stdout, stderr)

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def start(
    address: str,
    argv: list[str],
    env: dict[str, str],
    files: list[int],
    timeout: float | None = None,
    killed: threading.Event | None = None,
    forward: bool = False,
    started: Callable[[int], None] | None = None,
) -> int:
    """Run argv in a child of the server at address with files as its stdin, stdout and stderr;
    its exit status (128 + the signal's number when a signal ended it: the shell's convention).
    forward: pass SIGINT and SIGTERM on to the child (a shim standing in for the tool); started:
    called with the child's pid once it exists."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    connection.connect(address)
    with connection:
        request = {"argv": argv, "env": env, "cwd": os.getcwd()}
        connection.sendmsg(
            [orjson.dumps(request)],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", files))],
        )
        pid = orjson.loads(connection.recv(MESSAGE))["pid"]
        if started is not None:
            started(pid)
        if forward:
            for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(number, lambda received, _frame: _kill(pid, received))
        killer = None
        if timeout is not None:

            def kill() -> None:
                if killed is not None:
                    killed.set()
                _kill(pid, signal.SIGKILL)

            killer = threading.Timer(timeout, kill)
            killer.start()
        try:
            reply = connection.recv(MESSAGE)
        finally:
            if killer is not None:
                killer.cancel()
    if not reply:  # ended by a signal before it could say its status
        return 128 + signal.SIGKILL if killed is not None and killed.is_set() else 128 + 15
    return int(orjson.loads(reply)["status"])


def same_imports(one: dict[str, str], other: dict[str, str]) -> bool:
    """True when two environments agree on every variable that could matter to an import."""
    return all(
        one.get(name) == other.get(name) for name in set(one) | set(other) if _at_import(name)
    )


def _at_import(name: str) -> bool:
    if name in RUNTIME_NAMES:
        return False
    return name in IMPORT_NAMES or name.startswith(IMPORT_PREFIXES)


def _kill(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


_server: ForkServer | None = None
_pid: int | None = None


def server() -> ForkServer | None:
    """This process's fork server (started on first use), or None where forks are turned off or
    the server's imports were not silent. A server whose import-time variables no longer match this
    process's (a test's in-process tool run set TRANSFORMERS_VERBOSITY, say) is replaced by one
    started with the current ones."""
    global _server, _pid
    if os.environ.get("FARMKIT_TEST_FORK", "1") == "0":
        return None
    current = {name: value for name, value in os.environ.items() if _at_import(name)}
    if _server is None or _pid != os.getpid() or _server.import_env() != current:
        if _server is not None and _pid == os.getpid():
            _server.close()
        else:
            atexit.register(_close)
        _server, _pid = ForkServer(), os.getpid()
    return _server if _server.usable else None


def _close() -> None:
    if _pid == os.getpid():
        for each in (_server, *_threaded.values()):
            if each is not None:
                each.close()


# The recipes run their head steps (SFT, pairs, the reward model) with OMP_NUM_THREADS=2 (JOBS),
# which OpenMP reads when torch is imported: a second server started with that value serves them.
THREADED = {"OMP_NUM_THREADS": "2"}
_threaded: dict[str, ForkServer] = {}


def threaded_server() -> ForkServer | None:
    """A server like server()'s, started with THREADED's variables (None where forks are off)."""
    base = server()
    if base is None:
        return None
    key = repr(sorted({**base.import_env(), **THREADED}.items()))
    if key not in _threaded:
        for old in _threaded.values():
            old.close()
        _threaded.clear()
        _threaded[key] = ForkServer({**base.env, **THREADED})
    threaded = _threaded[key]
    return threaded if threaded.usable else None


SHIM = """#!{python}
import os, sys
sys.path.insert(0, {tests!r})
import forkserver
forkserver.shim({tool!r}, {servers!r})
"""


def shim(tool: str, servers: list[tuple[str, dict[str, str]]]) -> None:
    """A farm-* command on a recipe's PATH: run the real tool as a fork of the first server (address,
    import-time variables) whose variables match the command's, or exec it where none does (or the
    server is gone)."""
    argv = [tool, *sys.argv[1:]]
    env = dict(os.environ)
    address = choose(servers, env)
    if address is not None:
        try:
            status = start(address, argv, env, [0, 1, 2], forward=True)
        except (ConnectionError, FileNotFoundError):
            pass
        else:
            sys.exit(status)
    os.execv(tool, argv)


def choose(servers: list[tuple[str, dict[str, str]]], env: dict[str, str]) -> str | None:
    """The address of the first server whose import-time variables match env's, if it is up."""
    for address, server_env in servers:
        if same_imports(env, server_env):
            return address if os.path.exists(address) else None
    return None


def shim_folder() -> str | None:
    """A folder of farm-* shims for PATH (one per console script of this environment), or None
    where forks are off."""
    fork = server()
    if fork is None:
        return None
    servers = [(fork.address, fork.import_env())]
    threaded = threaded_server()
    if threaded is not None:
        servers.append((threaded.address, threaded.import_env()))
    # the shims name the servers' addresses: a folder per pair of servers
    partner = os.path.basename(threaded.folder) if threaded is not None else "alone"
    folder = os.path.join(fork.folder, f"bin-{partner}")
    if not os.path.isdir(folder):
        os.makedirs(folder)
        tests = str(Path(__file__).resolve().parent)
        for tool in sorted(Path(sys.executable).parent.glob("farm-*")):
            path = os.path.join(folder, tool.name)
            with open(path, "w") as file:
                file.write(
                    SHIM.format(
                        python=sys.executable,
                        tests=tests,
                        tool=str(tool),
                        servers=servers,
                    )
                )
            os.chmod(path, 0o755)
    return folder


def recipe_path(path: str) -> tuple[str, list[str]]:
    """PATH for a recipe or a shell pipeline with the farm-* shims first, and the make variable that
    keeps examples/venv.mk from putting the environment's bin/ before them (VENV=); PATH unchanged
    and no variable where forks are off."""
    shims = shim_folder()
    if shims is None:
        return path, []
    return f"{shims}{os.pathsep}{path}", ["VENV="]
