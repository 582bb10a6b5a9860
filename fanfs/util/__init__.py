"""Small utilities every layer uses: sizes, progress, worker processes, safe file opening."""
