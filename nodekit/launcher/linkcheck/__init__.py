"""The link check: pairs of nodes measured on the interface training uses, after a good preflight.

``rounds.py`` schedules disjoint pairs (every pair once up to 16 nodes; above, a seeded sample in which every node
meets a few others, then re-tests of the suspects against known-good nodes: a bound that does not grow with the
node count), ``probe.py`` measures one pair over an authenticated TCP connection to the partner's ``listener.py``
(which bounds the strangers in their handshake and pushes out the oldest), ``apart.py`` runs the listener and the
transfers in a process of their own (away from the launcher's interpreter lock), ``run.py`` drives the rounds over
the preflight store, ``verdict.py`` compares the pairs (pure) and renders the report every node prints. Standard
library only.
"""
