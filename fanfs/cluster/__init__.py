"""What starts and runs a job on many nodes: a node's start (stage or lazy, capacity, prefetch, peers),
the serving daemon and its hand-off, the node's view for in-process readers, Slurm's batch and node steps,
and pack on ranks.

May import every layer below it: the node's cache (:mod:`fanfs.cache`), the peers (:mod:`fanfs.peers`),
serve, pack, tune, store, records, codecs, util, errors.
"""
