"""GPU health before the job: what nvidia-smi, the kernel log and DCGM say about this node's GPUs, judged per GPU.

``parse.py`` reads the tools' text (tested on real outputs, tests/unit/launcher/fixtures/gpu), ``judge.py`` turns it
into findings with the fix (pure), ``gather.py`` runs the tools and shares every node's findings through the
preflight store so that every node names the sick one. Standard library only.
"""
