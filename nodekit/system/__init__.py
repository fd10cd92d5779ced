"""The edges to the machine: processes (proc/), Docker (docker/), this host's facts (host/), ssh command lines, atomic
files, progress reporting, packaged assets."""
