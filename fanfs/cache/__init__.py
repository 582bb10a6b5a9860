"""A node's cache of a store: how a node gets its blobs (share: its local copies made ready, its store, its mount's
hooks; what starts a node calls), staging (every shard a node holds, copied before the mount serves), the lazy
fill (a blob fetched on its first read, from its holder or the store), the capacity's plan (what a node
keeps), reads ahead in a known order (prefetch, order), and the local cache's file format (localcache).

May import errors, util, codecs, records, store and peers (it fetches from peers and stages over the MPI
world); never serve or what starts a job (:mod:`fanfs.cluster`), which uses it.
"""
