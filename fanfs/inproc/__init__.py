"""The in-process fast path of ``fanfs run``: a mount's files opened in the reader's own process (:mod:`.hook`)."""
