"""The `sglaunch` command line: one module per command, errors funnelled through `common`."""
