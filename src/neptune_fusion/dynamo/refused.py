"""The one exception of the translation."""


class Refused(Exception):
    """A graph node the translation cannot take, with the reason (never escapes the
    backend: the region falls back to the rest of the compiler with this reason)."""
