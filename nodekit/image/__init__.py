"""The image: the lock, the build, the Debian base, the base probe, the blob store, the fingerprint and the build
plan."""
