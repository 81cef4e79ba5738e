"""The one exception type for bad user input; the CLI prints it as a single line, exit code 2."""


class ConfigError(ValueError):
    """A bad configuration value, unknown name or missing file, with a message naming what is allowed."""
