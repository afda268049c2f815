"""Compression: knowledge distillation from a frozen teacher (`distill`), low-rank
factorisation (`lowrank`), structured channel pruning with a gradual schedule (`prune`),
and int8 quantisation-aware training with conversion (`quant`). Each is a function or a
run component; choosing among them by experiment (`tandem compress`) is not built yet."""
