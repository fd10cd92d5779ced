"""Configuration: nodekit.toml, ``NODEKIT_*`` and flags read once into Settings (settings.py), its tables, the file
itself, the checks on user input, and the starter file."""
