"""Datasets on every host: a ``[[mounts]]`` entry's ``source`` made present, identical, on each host's ``host`` path.

Plan, then apply: :mod:`nodekit.data.source` reads the source's manifest (with a hash cache), each host is scanned
by the receiver (:mod:`nodekit.launcher.datasync`, sent over the host's SSH connection by
:mod:`nodekit.data.transport`), :mod:`nodekit.data.plan` decides purely what travels, what is copied on the node
and what is deleted, and :mod:`nodekit.data.push` carries the plans out on every host at once.
"""
