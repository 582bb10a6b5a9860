"""The nodes of a job and how they talk: the MPI world (ranks, an agreed error, the index read once and
broadcast), who holds which blob (placement), and the peer protocol (the authenticated, sealed wire format,
the client that fetches a blob from its holder, the server that answers, and a node's end of them from its job's
start to its BYE).

May import errors, util, codecs, records and store (a server reads the shards it holds); never the node's
cache, serve, or what starts a job (:mod:`fanfs.cluster`), which use it.
"""
