"""A forked child of the fork server (`tandem/forking/server.py`) becoming a worker.

Once forked, the child leaves the server's frames (`BecomeWorker` carries the request
out of them) and takes what a new interpreter running `python -u SCRIPT ARGS` (or
`python -u -m MODULE ARGS`) would have: a session of its own, the agent's three streams,
the worker's environment, directory, `sys.argv`, `sys.orig_argv`, `sys.path`
(PYTHONPATH applied as a new interpreter applies it) and a new `__main__`, `-u`'s
unbuffered streams, fresh `random` and numpy seeds, torch's thread count from
OMP_NUM_THREADS, the default signal handlers and SIGTERM if the server dies. The script
then runs; it ends through the interpreter's own exit (threads joined, atexit, buffers,
KeyboardInterrupt as death by SIGINT), an uncaught traceback printed without the
server's frames.
"""

from __future__ import annotations

import builtins
import io
import os
import signal
import sys
import types
import warnings
from typing import Any

SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD}
PR_SET_PDEATHSIG = 1
# The files whose frames an uncaught traceback leaves out: the server's and this one.
SERVER_FILES = (__file__, os.path.join(os.path.dirname(__file__), "server.py"))


def python_path(value: str, cwd: str) -> list[str]:
    """The `sys.path` entries a new interpreter makes of PYTHONPATH `value` in `cwd`."""
    if not value:
        return []
    return [os.path.abspath(os.path.join(cwd, p)) for p in value.split(os.pathsep)]


class BecomeWorker(BaseException):
    """Raised in the forked child: leave the server's frames, then run the worker."""

    def __init__(self, request: dict[str, Any], fds: list[int], parent: int,
                 server_path: list[str]) -> None:
        super().__init__()
        self.request, self.fds, self.parent = request, fds, parent
        self.server_path = server_path  # the server's own PYTHONPATH entries in sys.path


def run_worker(become: BecomeWorker) -> None:
    """In the forked child, outside every frame of the server: become the worker.
    Returns when the script does; what it raises, the interpreter handles, as it would
    have in a worker started cold."""
    argv, env, cwd = become.request["argv"], become.request["env"], become.request["cwd"]
    _detach(become.parent)
    for target, fd in enumerate(become.fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _unbuffered_stdio()
    _fresh_state(env)
    sys.excepthook = _script_traceback
    rest = argv[1:]
    if rest[:1] == ["-u"]:
        rest = rest[1:]
    sys.orig_argv = list(argv)
    entries = python_path(env.get("PYTHONPATH", ""), cwd)
    own = become.server_path
    kept = sys.path[1 + len(own):] if sys.path[1:1 + len(own)] == own else sys.path[1:]
    sys.path[1:] = list(dict.fromkeys([*entries, *kept]))  # as `site` leaves it: no repeats
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    if rest[0] == "-m":
        import runpy

        # The module may have been imported here before the fork; runpy runs it afresh
        # as __main__ either way, as `python -m` does, and need not say so.
        warnings.filterwarnings("ignore", category=RuntimeWarning,
                                message=".*found in sys.modules after import of package")
        sys.argv = ["-m", *rest[2:]]
        sys.path[0] = cwd
        runpy._run_module_as_main(rest[1], alter_argv=True)  # what `python -m` runs
        return
    script = rest[0]
    where = os.path.abspath(script)
    from importlib.machinery import SourceFileLoader

    main.__dict__.update(__file__=where, __cached__=None, __builtins__=builtins,
                         __loader__=SourceFileLoader("__main__", where), __spec__=None,
                         __package__=None, __annotations__={})
    sys.argv = [script, *rest[1:]]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    with io.open_code(where) as source:
        code = compile(source.read(), where, "exec")
    exec(code, main.__dict__)  # noqa: S102 - running the worker's script is the point


def _detach(parent: int) -> None:
    """A session of the worker's own (a `killpg` in it reaches no other job), SIGTERM if
    the server dies, and the default signal handlers, unblocked."""
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    except (OSError, AttributeError):
        pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    if os.getppid() != parent:  # the server died before the death signal was set
        os.kill(os.getpid(), signal.SIGTERM)


def _unbuffered_stdio() -> None:
    """The standard streams `python -u` makes: stdout and stderr written through, unbuffered."""
    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        encoding = getattr(old, "encoding", None) or "utf-8"
        errors = getattr(old, "errors", None) or "strict"
        if fd == 0:
            stream = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)),
                                      encoding=encoding, errors=errors)
        else:
            stream = io.TextIOWrapper(io.FileIO(fd, "wb", closefd=False), encoding=encoding,
                                      errors=errors, write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _fresh_state(env: dict[str, str]) -> None:
    """What a new interpreter would start with: unseeded generators, its thread count."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None and env.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(max(1, int(env["OMP_NUM_THREADS"])))


def _script_traceback(kind: type[BaseException], err: BaseException, tb: Any) -> None:
    """Print an uncaught exception without the server's frames (those up to this
    module's last), as an interpreter that ran the worker cold would."""
    start, frame = tb, tb
    while frame is not None:
        if frame.tb_frame.f_code.co_filename in SERVER_FILES and frame.tb_next is not None:
            start = frame.tb_next
        frame = frame.tb_next
    sys.__excepthook__(kind, err.with_traceback(start), start)
