"""The experiments run with sdar_jax, beside the package (sdar_jax never imports them): their
drivers, their records as tidy tables in docs/results, and every report written from those
tables alone. docs/running.md, "Experiments and their records", has the commands."""
