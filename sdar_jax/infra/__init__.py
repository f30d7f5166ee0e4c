"""Layer 0, infrastructure: files local and remote (`paths`) and the processes of a multi-process
run (`multihost`). Knows nothing of models, rollouts or runs; every other layer may use it."""
