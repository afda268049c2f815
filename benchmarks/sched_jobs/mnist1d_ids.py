"""examples/mnist1d_cnn.py as a scheduled testbed job: no evaluation, sample ids logged.

The ids of every training micro-batch go to TANDEM_SAMPLE_LOG (one file per process), so
that `tandem.sched.service.sample_audit` can prove no sample was repeated or skipped through the
job's resizes and preemptions.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import mnist1d_cnn as example  # noqa: E402

import tandem  # noqa: E402
from tandem.sched.service.sample_audit import SampleLog, WithIds  # noqa: E402

IDS = SampleLog()


def loss(logits, batch):
    IDS.record(batch[-1])
    return example.task.loss(logits, batch)


task = tandem.Task(model=example.make_model, optimizer=example.make_optimizer,
                   train_data=lambda: WithIds(example.MNIST1D(train=True)), loss=loss)

if __name__ == "__main__":
    tandem.fit(task, defaults={"train.steps": 300, "train.global_batch": 128,
                               "monitor.log_every": 10, "checkpoint.every": 50,
                               "monitor.calibrate_at": 0, "monitor.progress": "log"})
