"""A dataset on a node, made equal to the source's: the scan (what nodekit put there, with a hash cache), the name
rules every entry must pass, and the receiver that writes a stream under the mount's host path only.

Standard library only, and importing nothing outside ``nodekit.launcher``: the head sends these modules to a node
(:mod:`nodekit.data.transport`) where the host's own ``python3`` runs them; nothing is installed there.
"""
