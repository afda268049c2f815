"""Fine-tuning: start from trained weights (`run.init_from`) and train a part of the model
(`train.freeze`). Both are run components (`tandem.components`), listed first so that
every later component (the weight average, recomputation, compilation) sees the loaded
and frozen model."""
