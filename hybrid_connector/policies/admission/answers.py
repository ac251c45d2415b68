"""Whether stored answers come back: an online estimate that decides answer storage.

Storing a finished request's answer (the KV of its generated tokens and one exact
end-of-request state, ``save_decode_cache``) pays off only when a later request's prompt
extends that whole answer: the next turn of a chat, an agent's next step, a multi-round
QA session. Where outputs never return as inputs (a Mooncake-style trace of independent
completions) every answer byte written is lost budget that prompts' states would have
used.

``AnswerReuse`` learns which of the two a workload is, per arrival, whatever was stored:

* ``finished(tokens, prompt_len)`` records each answer (prompt + output, ``n`` tokens) in
  a bounded FIFO of ``records`` entries, keyed by ``n`` and the last ``window`` tokens, with
  a digest of all ``n`` tokens to confirm a match. Answers not stored are recorded as well
  (a ghost list): the estimate never depends on its own decision, so it turns storage
  back on when answers start coming back.
* ``arrived(tokens)`` asks, for a new request, whether its tokens extend a recorded
  answer past its end (a hit there is the exact tail's), and updates an exponentially
  decayed rate ``rate`` of such arrivals (weight ``1 / horizon`` per arrival; starts at 1:
  answers are stored until evidence says otherwise).
* ``survived(ok)``: for an arrival that extends a *stored* answer, whether the host tier
  still held the answer's end-of-request state (``survival``, decayed over
  ``survival_horizon`` such arrivals, starting at 1). At a tight budget most answers are
  evicted before their next turn (chat at 1x the working set: 43% survive, 76% at 2x,
  94% at 4x), and each one written cost the room of ~94 tokens of KV.
* ``decide()``: store an answer while ``rate >= threshold`` and
  ``survival >= survival_threshold``; below the latter, every ``explore``-th answer
  only (those keep ``survival`` measured, so storage resumes when room frees up); below
  ``lost`` (next to none survives) every ``rare``-th only. Multi-round QA one request at a
  time at 0.25x the working set: 0 of 200 stored answers survived, each cost room and
  vLLM's own prefix cache kept what it would have served (head-to-head 0.184 -> 0.187,
  equal to OffloadingConnector's hit tokens); chat at 0.25x keeps ~11% surviving (every
  2nd answer, unchanged).

The same estimate, fed prompts (``record``) instead of answers, decides whether a request
saves its exact prompt end when its answer is not stored (``checkpoints.PromptGate``).

Measured arrival rates (the head-to-head's traces): chat with edits 0.83, multi-round QA
0.80, branching agents 0.69, Mooncake 0. Chat's first 24 arrivals are first turns (no
answer to extend yet): a horizon of 16 keeps ``rate`` at 0.21 through them, while
Mooncake's falls below 0.1 after 36 arrivals. Deterministic (exact token comparisons, no
clocks), O(``records`` * ``window``) memory. An arrival probes only the recorded lengths
whose last token its own tokens repeat there: one vectorised pass over a ring of the
records' (length, last token), then the window and digest of those few (it was a dictionary
probe per distinct recorded length, 14% of the vLLM scheduler side's opcodes at 256
requests in flight).
"""

from __future__ import annotations

import numpy as np
import xxhash

RECORDS = 1024  # answers remembered (a chat's next turn comes back within ~220 requests)
WINDOW = 16  # tokens before an answer's end that key it
HORIZON = 16.0  # arrivals the decayed rate averages over
THRESHOLD = 0.1  # store answers while at least this share of arrivals extends one
SURVIVAL_HORIZON = 32.0  # arrivals on stored answers the survival rate averages over
SURVIVAL_THRESHOLD = 0.5  # below this share of stored answers surviving to their reuse ...
EXPLORE = 2  # ... only every 2nd answer is stored
LOST = 0.05  # below this share surviving (next to none: every answer stored is lost) ...
RARE = 32  # ... only every 32nd


def _digest(toks: np.ndarray) -> bytes:
    # xxh3-128 at memory speed: blake2b over a long prompt's 8-byte tokens took ~60 us, a
    # fifth of the vLLM scheduler side's time under eviction; this is a 128-bit equality
    # check, not a security boundary (a collision only misleads the estimate)
    return xxhash.xxh3_128_digest(np.ascontiguousarray(toks, dtype=np.int64).data)


class AnswerReuse:
    """The estimate of the module docstring. Not thread safe (the vLLM scheduler side calls
    it from the engine-core thread only)."""

    def __init__(self, records: int = RECORDS, window: int = WINDOW, horizon: float = HORIZON,
                 threshold: float = THRESHOLD, survival_horizon: float = SURVIVAL_HORIZON,
                 survival_threshold: float = SURVIVAL_THRESHOLD, explore: int = EXPLORE,
                 lost: float = LOST, rare: int = RARE) -> None:
        if (records <= 0 or window <= 0 or horizon < 1 or survival_horizon < 1 or explore < 1
                or rare < 1):
            raise ValueError(f"bad sizes: records={records} window={window} horizon={horizon} "
                             f"survival_horizon={survival_horizon} explore={explore} rare={rare}")
        self.window, self.threshold = window, threshold
        self.survival_threshold, self.explore = survival_threshold, explore
        self.lost, self.rare = lost, rare
        self._alpha = 1.0 / horizon
        self._beta = 1.0 / survival_horizon
        self._tick = 0
        self._cap = records
        # n -> window -> digest -> (refs, stored): answers of one length and one window but
        # other earlier tokens are other answers (keyed by the window alone, a later one
        # took the first one's digest and outlived it)
        self._keys: dict[int, dict[bytes, dict[bytes, tuple[int, bool]]]] = {}
        # The FIFO as a ring: record i sits in slot i % records, its key in ``_slots`` and
        # its length and last token in two arrays (the prefilter of ``extends_answer``);
        # record i + records takes the slot and drops record i.
        self._slots: list[tuple[int, bytes, bytes] | None] = [None] * records
        self._ring_n = np.zeros(records, dtype=np.int64)
        self._ring_last = np.full(records, -1, dtype=np.int64)
        self._recorded = 0
        self.rate = 1.0
        self.survival = 1.0
        self.arrivals = 0
        self.came_back = 0

    @property
    def stores(self) -> bool:
        """Whether answers come back often enough to store them (room aside)."""
        return self.rate >= self.threshold

    def decide(self) -> bool:
        """Whether the next answer is stored (``stores``, then the room rule of the module
        docstring; an explored answer counts every call)."""
        if not self.stores:
            return False
        if self.survival >= self.survival_threshold:
            return True
        self._tick += 1
        every = self.explore if self.survival >= self.lost else self.rare
        return self._tick % every == 0

    def __len__(self) -> int:
        return min(self._recorded, self._cap)

    def _win(self, toks: np.ndarray, n: int) -> bytes:
        return np.ascontiguousarray(toks[max(0, n - self.window):n], dtype=np.int64).tobytes()

    def finished(self, tokens: np.ndarray, prompt_len: int, stored: bool = True) -> None:
        """Record the answer of a finished request (``tokens``: prompt + output, the first
        ``prompt_len`` of them the prompt; ``stored``: whether it was stored); nothing when it
        generated no token."""
        if int(tokens.size) > prompt_len:
            self.record(tokens, stored)

    def record(self, tokens: np.ndarray, stored: bool = True) -> None:
        """Record an end at ``tokens.size`` (an answer's, or a prompt's for
        ``checkpoints.PromptGate``): ``arrived`` then counts requests that extend it."""
        n = int(tokens.size)
        win, digest = self._win(tokens, n), _digest(tokens[:n])
        by = self._keys.setdefault(n, {}).setdefault(win, {})
        refs, was = by.get(digest, (0, False))
        by[digest] = (refs + 1, was or stored)
        slot = self._recorded % self._cap
        old, self._slots[slot] = self._slots[slot], (n, win, digest)
        self._ring_n[slot] = n
        self._ring_last[slot] = int(tokens[n - 1]) if n else -1  # token ids are >= 0
        self._recorded += 1
        if old is not None:  # dropped after the new one counts: a repeat keeps its flag
            self._drop(*old)

    def _drop(self, n: int, win: bytes, digest: bytes) -> None:
        wins = self._keys[n]
        by = wins[win]
        refs, stored = by[digest]
        if refs > 1:
            by[digest] = (refs - 1, stored)
            return
        del by[digest]
        if not by:
            del wins[win]
            if not wins:
                del self._keys[n]

    def extends_answer(self, tokens: np.ndarray) -> tuple[int, bool] | None:
        """The length and stored flag of the longest recorded answer ``tokens`` extend past
        its end; None when they extend none. No side effects."""
        size = int(tokens.size)
        live = len(self)
        if not live or not size:
            return None
        ns = self._ring_n[:live]
        below = ns < size  # answers ``tokens`` run past the end of
        ns = ns[below]
        if not ns.size:
            return None
        # the window's last token must match before the window and digest are compared
        cands = set(ns[tokens[ns - 1] == self._ring_last[:live][below]].tolist())
        if not cands:
            return None
        raw = np.ascontiguousarray(tokens, dtype=np.int64).tobytes()  # a window: a slice of it
        w, keys = self.window, self._keys
        for n in sorted(cands, reverse=True):  # longest first
            by = keys[n].get(raw[8 * (n - w if n > w else 0):8 * n])
            got = by.get(_digest(tokens[:n])) if by is not None else None
            if got is not None:
                return n, got[1]
        return None

    def arrived(self, tokens: np.ndarray) -> tuple[int, bool] | None:
        """Count a new request (its prompt ``tokens``) in the rate; returns
        ``extends_answer``. Call once per request."""
        back = self.extends_answer(tokens)
        self.arrivals += 1
        self.came_back += back is not None
        self.rate += self._alpha * (float(back is not None) - self.rate)
        return back

    def survived(self, ok: bool) -> None:
        """An arrival extended a stored answer: ``ok`` when its end-of-request state was
        still held."""
        self.survival += self._beta * (float(ok) - self.survival)
