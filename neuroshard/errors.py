"""Exceptions the toolkit raises for a user's mistake; the CLI prints them as one line."""


class NeuroShardError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""


class FormatError(NeuroShardError, ValueError):
    """A tables or plan file that does not follow its format."""


class InvalidPlanError(NeuroShardError, ValueError):
    """A plan that does not tile its tables or overflows a device."""


class WriteError(NeuroShardError, OSError):
    """An output could not be written (no space, a file-size limit, no permission, a read-only
    file system); the message names the path and the reason, and the old file is intact."""


def os_reason(exc: OSError) -> str:
    """An ``OSError``'s reason in a few words ("No space left on device"), without the path."""
    return exc.strerror or str(exc).splitlines()[0] or type(exc).__name__


class InfeasibleError(NeuroShardError):
    """No plan can exist for this task (tables larger than the devices' memory)."""
