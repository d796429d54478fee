"""The output formats every command offers (``--format``).

A module without dependencies: the command line names the formats in its help without
importing the renderers (and with them pandas)."""

FORMATS = ("table", "csv", "json", "markdown")

#: How CSV output keeps a spreadsheet from running a cell (:func:`bmoe.render.tables.
#: formula_safe`), said in the help of every command that writes CSV.
CSV_FORMULAS = (
    "in csv a text cell starting with = + - @, a tab or a carriage return (a spreadsheet "
    "formula) is written with a ' in front, so it stays text; numbers are written as they are"
)
#: The help of every ``--format`` option.
FORMAT_HELP = f"One of {', '.join(FORMATS)}; {CSV_FORMULAS}."
