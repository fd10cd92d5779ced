"""The link check: every pair of nodes measured on the interface training uses, after a good preflight.

``rounds.py`` schedules disjoint pairs (every pair once), ``probe.py`` measures one pair over an authenticated TCP
connection to the partner's ``listener.py`` (which bounds the strangers in their handshake and pushes out the
oldest), ``run.py`` drives the rounds over the preflight store, ``verdict.py`` compares the pairs (pure) and renders
the matrix every node prints. Standard library only.
"""
