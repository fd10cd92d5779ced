"""Same data on every node: manifests of mounted directories, their comparison, and the file hash both sides use."""
