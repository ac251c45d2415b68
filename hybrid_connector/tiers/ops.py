"""Transfer operations: what the index decides and a worker's ``Executor`` carries out.

The index (scheduler process, cache server, or embedded) owns the ledger of what is where
and never touches bytes; every byte a tier holds got there through one of these ops, run
by the executor of the process that holds the bytes (each tensor-parallel rank runs the
same ops on its own shard). Ops are plain immutable values so they can cross processes.

* ``Put(key, tier)``: store the payload the worker was given for ``key`` in ``tier``.
* ``Move(key, src, dst)``: demote or promote: copy from ``src`` to ``dst``, then remove it
  from ``src`` (a shared tier is never removed from: the move is a copy).
* ``Remove(key, tier)``: delete from ``tier`` (never sent for a shared tier).
* ``Take(key, tier)``: read into the worker's stash and delete from ``tier`` (a shared tier
  is only read); a later ``Put`` of that key without a payload stores the stashed copy.
  A promotion is ``Take``, the demotions that make room (which may use the room the take
  freed), then ``Put``.
* ``Record(key, tier, name, data)``: append ``data`` to manifest ``name`` on the shared
  ``tier`` (how other instances find ``key``), unless the batch's put of ``key`` there
  failed. Only one rank need run it (the record is the same on every rank).

An op's result is True only when it fully happened; a failed ``Put`` or ``Move`` leaves no
copy in its destination, so the ledger can forget the object without orphaning bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybrid_connector.core.keys import ObjectKey


@dataclass(frozen=True, slots=True)
class Put:
    key: ObjectKey
    tier: str


@dataclass(frozen=True, slots=True)
class Move:
    key: ObjectKey
    src: str
    dst: str


@dataclass(frozen=True, slots=True)
class Remove:
    key: ObjectKey
    tier: str


@dataclass(frozen=True, slots=True)
class Take:
    key: ObjectKey
    tier: str


@dataclass(frozen=True, slots=True)
class Record:
    key: ObjectKey
    tier: str
    name: str
    data: bytes


Op = Put | Move | Remove | Take | Record
