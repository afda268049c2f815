"""The tuner: diagnosis-driven validation trials that pick the execution plan.

`tandem tune train.py --nproc-per-node N` measures the current plan, diagnoses it, runs
controls and candidate plans as real short runs (`trial.py`), judges them with sound
statistics (`stats.py`) and a convergence guardrail (`guard.py`), and writes the chosen
plan (`planfile.py`) with its decision record in the run store. `--hparams` searches
hyper-parameters with Optuna instead (`hparams.py`).
"""
