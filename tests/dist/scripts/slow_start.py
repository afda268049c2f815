"""The toy task whose model factory, on rank 0, says it has started (a file) and then
waits for a file that never comes: a signal sent after that file appears surely arrives
during start-up, whatever the host's speed (rank 1 meanwhile waits in the preflight's
collective for rank 0)."""

import os
import time
from pathlib import Path

import tandem
from tests.dist import toy_task

MARKER_ENV = "SLOW_START_DIR"  # where the factory writes `building` and waits for `go`


def model():
    if os.environ.get("RANK", "0") == "0":
        folder = Path(os.environ[MARKER_ENV])
        (folder / "building").write_text(str(os.getpid()))
        deadline = time.monotonic() + 300
        while not (folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return toy_task.make_model()


task = tandem.Task(model=model, optimizer=toy_task.make_optimizer,
                   train_data=toy_task.IndexedData, loss=toy_task.loss)

if __name__ == "__main__":
    tandem.fit(task, defaults={"train.steps": 5, "train.global_batch": 20})
