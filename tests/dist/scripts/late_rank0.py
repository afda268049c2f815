"""The toy task, run with a bad flag, where rank 0 reaches its usage error only after
rank 1 has exited with its own: the agent then stops rank 0 before it can speak, the
order that a loaded host produces now and then, made certain here."""

import os
import time
from pathlib import Path

import psutil

import tandem
from tests.dist import toy_task


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


folder = Path(os.environ["LATE_DIR"])
if os.environ["RANK"] == "1":
    (folder / "rank1").write_text(str(os.getpid()))
else:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        mark = folder / "rank1"
        if mark.exists() and mark.read_text() and _gone(int(mark.read_text())):
            break
        time.sleep(0.02)

task = tandem.Task(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                   train_data=toy_task.IndexedData, loss=toy_task.loss)

if __name__ == "__main__":
    tandem.fit(task)
