"""examples/char_lm.py as a scheduled testbed job: no evaluation, sample ids logged
(see mnist1d_ids.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import char_lm as example  # noqa: E402

import tandem  # noqa: E402
from tandem.sched.service.sample_audit import SampleLog, WithIds  # noqa: E402

IDS = SampleLog()


def loss(logits, batch):
    IDS.record(batch[-1])
    return example.loss(logits, batch)


task = tandem.Task(model=example.CharLM, optimizer=example.optimizer,
                   train_data=lambda: WithIds(example.Windows("train")), loss=loss,
                   tokens_per_sample=example.SEQ_LEN)

if __name__ == "__main__":
    tandem.fit(task, defaults={"train.steps": 100, "train.global_batch": 32,
                               "train.grad_clip": 1.0, "monitor.log_every": 10,
                               "checkpoint.every": 50, "monitor.calibrate_at": 0,
                               "monitor.progress": "log"})
