"""The toy task as a scheduled job: logs the sample ids it trains on (TANDEM_SAMPLE_LOG).

TOY_SAMPLE_SLEEP (seconds per sample) stretches each training micro-batch in proportion to
its size, as compute would (two processes take half the time per step), so that a test's
scheduler decisions land while the job trains.
"""

import os
import time

import tandem
from tandem.sched.service.sample_audit import SampleLog
from tests.dist import toy_task

SLEEP = float(os.environ.get("TOY_SAMPLE_SLEEP", "0"))
IDS = SampleLog()


def loss(out, batch):
    if SLEEP and out.requires_grad:
        time.sleep(SLEEP * len(batch[2]))
    IDS.record(batch[2])
    return toy_task.loss(out, batch)


task = tandem.Task(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                   train_data=toy_task.IndexedData, loss=loss)

if __name__ == "__main__":
    tandem.fit(task, defaults={"train.global_batch": 40, "monitor.calibrate_at": 0,
                               "monitor.log_every": 5, "checkpoint.every": 10,
                               "monitor.progress": "log"})
