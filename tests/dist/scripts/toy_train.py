"""The toy task as a user script: the same file under python, torchrun and tandem run."""

import tandem
from tests.dist import toy_task

task = tandem.Task(
    model=toy_task.make_model,
    optimizer=toy_task.make_optimizer,
    train_data=toy_task.IndexedData,
    eval_data=toy_task.IndexedData,
    loss=toy_task.loss,
)

if __name__ == "__main__":
    tandem.fit(task)
