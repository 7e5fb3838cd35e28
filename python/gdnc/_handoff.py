"""Recompute workspaces waiting for their backward: the ckpt step's tape hand-off on the Python side.

Under torch.utils.checkpoint(use_reentrant=False) the recompute runs our forward again with a new
ctx, and autograd hands its saved tensors (our saved region among them) to the ORIGINAL ctx's
backward. That backward finds the recompute's stamped workspace by the saved region's address.

An address alone is not an identity: a recompute whose backward never runs (torch.autograd.grad
over part of a graph, an exception between the two) leaves its entry behind, and once its saved
region is freed the caching allocator may hand the same address to a later call of the same shape,
whose backward would then bind another call's tapes (libgdn's stamp names the saved address, so
it cannot tell them apart). An entry therefore lives exactly as long as the saved tensor the
recompute wrote: a finalizer on that tensor drops it, and while the tensor lives no other
allocation can hold its address.
"""

import itertools
import weakref


class RecomputeWorkspaces:
    """Workspaces by saved-region address, each alive only while its saved tensor is."""

    def __init__(self, limit=64):
        self._entries = {}  # address -> (token, workspace, finalizer)
        self._tokens = itertools.count()
        self._limit = limit

    def remember(self, saved, address, workspace):
        """Keeps `workspace` for the backward that will receive `saved` (whose data is at `address`)."""
        self._drop(address)
        while len(self._entries) >= self._limit:  # backwards that never came: the oldest go first
            self._drop(next(iter(self._entries)))
        token = next(self._tokens)
        finalizer = weakref.finalize(saved, self._forget, address, token)
        finalizer.atexit = False
        self._entries[address] = (token, workspace, finalizer)

    def take(self, address):
        """The workspace a recompute left for the saved region at `address`, or None; forgets it."""
        entry = self._entries.pop(address, None)
        if entry is None:
            return None
        entry[2].detach()
        return entry[1]

    def __len__(self):
        return len(self._entries)

    def _drop(self, address):
        entry = self._entries.pop(address, None)
        if entry is not None:
            entry[2].detach()

    def _forget(self, address, token):
        # Only this tensor's entry: a later recompute may have taken the address since.
        entry = self._entries.get(address)
        if entry is not None and entry[0] == token:
            del self._entries[address]
