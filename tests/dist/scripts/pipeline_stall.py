"""A two-stage pipeline whose last block stalls: after STALL_AFTER forward calls it notes
the time in STALL_FILE and sleeps ten minutes, inside a schedule step of the stage that
holds it (a hidden stuck schedule)."""

import os
import time

import tandem
from tests.dist.token_data import char_lm_task

calls = 0


def stall(module: object, args: object, output: object) -> None:
    global calls
    calls += 1
    if calls == int(os.environ["STALL_AFTER"]):
        with open(os.environ["STALL_FILE"], "w") as f:
            f.write(str(time.time()))
        time.sleep(600)


def model() -> object:
    built = base.model()
    built.blocks[-1].register_forward_hook(stall)
    return built


base = char_lm_task(7, 64, 8, dim=16, layers=4, heads=2)
task = tandem.Task(model=model, optimizer=base.optimizer, train_data=base.train_data,
                   loss=base.loss)

if __name__ == "__main__":
    tandem.fit(task)
