"""The output formats every command offers (``--format``).

A module without dependencies: the command line names the formats in its help without
importing the renderers (and with them pandas)."""

FORMATS = ("table", "csv", "json", "markdown")
