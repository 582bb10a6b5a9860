"""The mount: the libfuse3 low-level binding, the FUSE front, the daemon and its control socket."""
