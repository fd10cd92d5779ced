"""The job: frozen specs, what one node's plan needs gathered from the world, the per-rank plan, the rank environment
and the job secret."""
