"""A node's end of the peer protocol, from its job's start to its BYE: the peer client and server set up in the order
a job's start allows.

The serving daemon opens its listener and makes the job's private key before MPI starts (:class:`PeerEnd`; the key
never leaves that process); its rank gathers every node's address and public key in the job's last MPI call
(:func:`exchange_cards`); the daemon then makes its client to the other nodes (:meth:`PeerEnd.join`), and once its
store's local source is there, the server that answers them (:meth:`PeerEnd.answer`); at the end it tells every peer
BYE and closes the server (:meth:`PeerEnd.close`).
"""

from __future__ import annotations

from collections.abc import Callable

from ..store.index import Index
from ..store.sources import HeldShards
from .peer import PeerClient, listen, peer_host
from .peerserver import PeerServer
from .peerwire import NodeKey
from .world import World

Card = tuple[tuple[str, int], bytes]  # a node's peer address and public key


class PeerEnd:
    """This node's listener and key, then its client and server."""

    def __init__(self) -> None:
        self.listener = listen(peer_host())
        self.key = NodeKey()  # this job's private key: never leaves this process
        self.client: PeerClient | None = None
        self.server: PeerServer | None = None

    @property
    def card(self) -> Card:
        """What the other nodes need to reach this one."""
        return self.listener.getsockname()[:2], self.key.public

    def join(self, endpoints: list[tuple[str, int]], publics: list[bytes], rank: int, index: Index,
             timeout: float) -> PeerClient:
        """The client through which this node (rank ``rank``) reads from the others."""
        self.client = PeerClient(endpoints, publics, rank, self.key, bytes.fromhex(index.meta["store_id"]),
                                 index.blob_stored, timeout)
        return self.client

    def answer(self, index: Index, local: HeldShards, publics: list[bytes], rank: int,
               on_bye: Callable[[int], None]) -> PeerServer:
        """The server that answers the others from ``local`` (started by the mount once it has forked)."""
        self.server = PeerServer(self.listener, index, local, self.key, publics, rank,
                                 bytes.fromhex(index.meta["store_id"]), on_bye=on_bye)
        return self.server

    def close(self) -> None:
        """Tell every peer BYE, then stop answering."""
        if self.client is not None:
            self.client.say_bye()
        if self.server is not None:
            self.server.close()


def exchange_cards(world: World, card: Card) -> tuple[list[tuple[str, int]], list[bytes]]:
    """Every node's peer address and public key, by rank.  The job's last MPI call (from here on, sockets): every
    rank is here and alive, so MPI is finalised right after and leaves nothing behind (/dev/shm segments)."""
    address, public = card
    gathered = world.allgather((tuple(address), public))
    world.finalize()
    return [a for a, _ in gathered], [p for _, p in gathered]
