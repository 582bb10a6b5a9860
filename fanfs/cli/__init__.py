"""The ``fanfs`` command (kept light: a Ctrl-C while it starts must land inside its error handling)."""
