"""torchrun's agent, with its failure report cut to one line.

`tandem run` starts `python -m tandem.launcher.torchrun_agent ARGS`, which is `torchrun ARGS`
except for how a failure ends: torchrun prints a ChildFailedError traceback and a table after the
failed rank's own message; here a rank that stopped with a usage error (exit status 2,
its one-line message already printed) ends the agent quietly with that status, and any
other failure is named in one line (rank, exit status, where its traceback is).
A signal that stops the agent (Ctrl-C, SIGTERM) ends it without a traceback either.

Everything the imports left is frozen out of the cyclic garbage collector: the agent
creates few objects afterwards, and its exit no longer walks the hundreds of thousands
of objects torch's import leaves.
"""

from __future__ import annotations

import gc
import logging
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

from tandem.launcher.local_agent import describe
from tandem.status import ExitStatus


def _quiet_usage_exits(record: logging.LogRecord) -> bool:
    """Drop torchrun's own line about a worker that exited with a usage error."""
    return f"(exitcode: {ExitStatus.USAGE})" not in record.getMessage()


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with `argv`; return the job's exit status."""
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(
        _quiet_usage_exits)
    gc.freeze()
    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        code = failure.exitcode if failure.exitcode is not None else 1
        if code != ExitStatus.USAGE:
            sys.stderr.write(f"tandem: {describe(rank, failure.pid, code)}; its own "
                             "message is above\n")
        return code if code > 0 else 1
    except SignalException as err:
        return 128 + int(err.sigval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
