"""The toy task, recording which launcher (LAUNCHER_TAG, set in each launcher's
environment) started the process of which rank: `RANKS_DIR/launcher{tag}_rank{rank}`."""

import os
from pathlib import Path

import tandem
from tests.dist import toy_task

task = tandem.Task(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                   train_data=toy_task.IndexedData, loss=toy_task.loss)

if __name__ == "__main__":
    folder = Path(os.environ["RANKS_DIR"])
    (folder / f"launcher{os.environ['LAUNCHER_TAG']}_rank{os.environ['RANK']}").touch()
    tandem.fit(task, defaults={"train.steps": 3, "train.global_batch": 40})
