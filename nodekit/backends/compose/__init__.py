"""One node's compose file: rendered from the node's plan, written, started with ``docker compose``."""
