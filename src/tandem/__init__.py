"""tandem: write a PyTorch training task once; run it on 1..N processes."""

from tandem.config import Config
from tandem.fit import RunResult, fit
from tandem.task import Task

__all__ = ["Config", "RunResult", "Task", "fit"]
__version__ = "0.1.0"
