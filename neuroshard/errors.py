"""Exceptions the toolkit raises for a user's mistake; the CLI prints them as one line."""


class NeuroShardError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""


class FormatError(NeuroShardError, ValueError):
    """A tables or plan file that does not follow its format."""


class InvalidPlanError(NeuroShardError, ValueError):
    """A plan that does not tile its tables or overflows a device."""


class InfeasibleError(NeuroShardError):
    """No plan can exist for this task (tables larger than the devices' memory)."""
