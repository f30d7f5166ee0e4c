"""Layer 3, observation: metric reductions and the metrics log, progress lines and logging,
timings, the gate diagnostics (histograms and the token view), episode transcripts, and the
collection of many runs into tables and plots. It reads what training produces and never drives
it; it may use the rollout and core layers below it."""
