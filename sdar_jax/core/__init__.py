"""Layer 1, core: pure JAX beside `sdar_jax.models` and `sdar_jax.algos` (the same layer). The
device mesh and sharding rules, the batch types, the train state and optimizer, the compiled
update (`train_step`) and the sampler (`sampling`). No environments, no files, no plotting."""
