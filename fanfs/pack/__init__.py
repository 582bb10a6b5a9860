"""Making stores: walk the tree, classify files, plan codecs (``select``), pack shards and the index."""
