"""Every rank's Python stack, and its progress: hook.py (armed in every process of the job), collect.py (read them
on this node), dump.py (faulthandler's text, parsed) and places.py (ranks grouped by where they wait: pure)."""
