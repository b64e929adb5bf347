"""A tiny error hierarchy; library errors are translated at the boundary."""


class ReplaywatchError(Exception):
    """Base of every error replaywatch raises on purpose."""


class ConfigError(ReplaywatchError):
    """Bad configuration or input: reported in one line, exit code 2."""


class SourceError(ReplaywatchError):
    """A source could not be read this time; the poll records it as data."""


class SourceTimeout(SourceError):
    """The source did not answer within its per-poll timeout."""


class SourceUnreachable(SourceError):
    """Nothing listens at the address, or the connection failed."""


class SourceProtocolError(SourceError):
    """Something answered, but not with what a Reverb server or probe sends."""
