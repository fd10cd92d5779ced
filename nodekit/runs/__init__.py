"""What happened to each run, kept on the machine that started it: records, alerts and a report to look at.

- :mod:`~nodekit.runs.events`: the few calls a backend makes while a run goes on (``RunEvents``); a no-op default.
- :mod:`~nodekit.runs.model`: a run record as data (hosts and ranks, per-node phase times, exit codes, the failing
  node, rank and signal), to and from JSON; which phase a log line marks (pure).
- :mod:`~nodekit.runs.store`: ``.nodekit/runs/<id>/`` (run.json, log.txt, samples.jsonl): new ids, listing,
  lookup by id prefix, pruning to ``runs_keep``.
- :mod:`~nodekit.runs.recorder`: the live writer a command hands to its backend; it also sends the notifications.
- :mod:`~nodekit.runs.notify`: the ``[notify]`` webhook: messages (pure) and a sender that never holds up the job.
- :mod:`~nodekit.runs.report`: one self-contained HTML page of a record (pure).

Below the backends (they call :class:`~nodekit.runs.events.RunEvents`), above the job, image and config it records.
"""
