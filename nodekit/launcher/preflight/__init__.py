"""Preflight: every node's stack and network facts, published to main, compared into one verdict."""
