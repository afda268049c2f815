"""Compression: knowledge distillation from a frozen teacher (`distill`), low-rank
factorisation (`lowrank`), structured channel pruning with a gradual schedule (`prune`),
int8 and int4 quantisation-aware training with conversion to fbgemm's int8 kernels
(`quant`); `tandem compress` (`experiment`, `candidates`, `measure`) weighs them by
experiment against the original."""
