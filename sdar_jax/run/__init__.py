"""Layer 4, runs: a config checked (`config_validation`) and built (`setup`), the `Trainer` that
composes rollout, update, evaluation, checkpoints (`checkpoint`) and logs, the expert warm start
(`warm_start`), evaluation records (`evaluation`) and the workdir's lock (`workdir_lock`). Only
this layer (and the commands above it) holds a Trainer."""
