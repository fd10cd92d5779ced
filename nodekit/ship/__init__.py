"""Moving an image between Docker engines without a registry: push (engine to engines), save and load (files).

Split by responsibility; this package re-exports the public names, so ``from nodekit import ship`` and
``ship.plan_push`` / ``ship.push`` / ``ship.save`` / ``ship.load`` keep working:

- :mod:`~nodekit.ship.plan`: pure. Given what each target engine has (``TargetState``), :func:`plan_push` decides
  per target whether to skip, re-tag or load, and with which compression; it refuses before anything moves when a
  target is unreachable or short of disk.
  Per loading target it also decides which of the image's layers travel (:func:`plan_layers`, by chain id).
- :mod:`~nodekit.ship.layers`: :class:`WithoutLayers` leaves the layer files a target has out of the ``docker
  save`` stream, on the fly.
- :mod:`~nodekit.ship.engines`: :func:`source_of` and :func:`survey` ask the engines what they have.
- :mod:`~nodekit.ship.fanout`: :func:`push` carries a plan out: one ``docker save`` on the source, compressed once,
  fanned out to one ``docker load`` per target in parallel, then the image id on every target is compared with the
  source's. A target whose stream breaks is cut off (its engine discards the partial load), so a failed push leaves
  that target's existing images as they were.
  :mod:`~nodekit.ship.fanout_stream`: :class:`~nodekit.ship.fanout_stream.FanOut` carries one such stream (its
  queues, one worker per target, the stall and answer deadlines).
- :mod:`~nodekit.ship.grouping`: which targets share a stream and which may relay it (pure);
  :mod:`~nodekit.ship.outcome`: each target's image id checked, a failed load named by its cause, and the deadline
  on a target's answer once the stream's last byte reached it (:data:`~nodekit.ship.outcome.ANSWER_S`).
- :mod:`~nodekit.ship.relay`: relay chains: ssh:// targets that take the same stream pass it on to each other
  (a shell script run over SSH on each, host keys pinned by the head), so the head sends it once; a node dials the
  next with a key made for that push and hop (:mod:`~nodekit.ship.hopkeys`), never with the user's.
- :mod:`~nodekit.ship.mux`: :class:`SharedSsh`, one SSH connection per node for the length of a push.
- :mod:`~nodekit.ship.stream`: compression of the stream (and whether zstd is here), and what a failed
  ``docker load`` means.
- :mod:`~nodekit.ship.files`: :func:`save` and :func:`load`, the image as a file; :mod:`~nodekit.ship.scan` reads a
  file on its way into ``docker load`` and holds its end back until :mod:`nodekit.image.contents` has checked it.
"""

from __future__ import annotations

from nodekit.errors import EngineError
from nodekit.image.archive import chain_ids, chains_of
from nodekit.ship.codecs import Codec, Compress, choose_codec, codec_for_file
from nodekit.ship.engines import layers_held, source_of, survey
from nodekit.ship.fanout import push
from nodekit.ship.files import LoadedFile, Saved, load, save
from nodekit.ship.grouping import relay_candidates, relay_text
from nodekit.ship.layers import WithoutLayers
from nodekit.ship.mux import SharedSsh
from nodekit.ship.outcome import ProgressFn, PushResult
from nodekit.ship.plan import (
    DISK_FACTOR,
    SCHEMES,
    Action,
    Layer,
    LayerPlan,
    PushPlan,
    Source,
    Step,
    Target,
    TargetState,
    format_layer_list,
    parse_layer_list,
    parse_target,
    plan_layers,
    plan_push,
    sized_layers,
)
from nodekit.ship.relay import RELAY_MIN_BYTES, RELAY_MODES, RelayMode
from nodekit.ship.stream import PROGRESS_EVERY_S, compressed, diagnose_load_failure, zstd_here
from nodekit.system import docker as docker

__all__ = [
    "DISK_FACTOR",
    "PROGRESS_EVERY_S",
    "RELAY_MIN_BYTES",
    "RELAY_MODES",
    "SCHEMES",
    "Action",
    "Codec",
    "Compress",
    "EngineError",
    "Layer",
    "LayerPlan",
    "LoadedFile",
    "ProgressFn",
    "PushPlan",
    "PushResult",
    "RelayMode",
    "Saved",
    "SharedSsh",
    "Source",
    "Step",
    "Target",
    "TargetState",
    "WithoutLayers",
    "chain_ids",
    "chains_of",
    "choose_codec",
    "codec_for_file",
    "compressed",
    "diagnose_load_failure",
    "format_layer_list",
    "layers_held",
    "load",
    "parse_layer_list",
    "parse_target",
    "plan_layers",
    "plan_push",
    "push",
    "relay_candidates",
    "relay_text",
    "save",
    "sized_layers",
    "source_of",
    "survey",
    "zstd_here",
]
