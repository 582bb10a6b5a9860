"""Many nodes: MPI start-up, placement, staging, peers over TCP, a node's mount, Slurm jobs."""
