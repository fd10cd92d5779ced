"""Facts about this machine, gathered in one place and returned as data (``nodekit.job.spec.HostFacts``)."""
