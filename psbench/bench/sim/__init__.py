"""The scale model: per-step cost of PS / ring allreduce / Spark, calibrated here, projected."""
