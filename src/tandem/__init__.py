"""tandem: write a PyTorch training task once; run it on 1..N processes."""

from tandem.config import Config
from tandem.fit import RunResult, fit
from tandem.losses import CrossEntropy
from tandem.task import Task

__all__ = ["Config", "CrossEntropy", "RunResult", "Task", "fit"]
__version__ = "0.1.0"
