"""nodekit: one pinned image, one compose file per node, multi-node PyTorch without a scheduler.

This module is copied into the image next to ``nodekit.launcher``; it must stay free of imports.
"""

__version__ = "0.1.0"
