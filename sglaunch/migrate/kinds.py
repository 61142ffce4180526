"""The names `migrate-flags` shares between its engine and its command line, in a module that
imports nothing: the command's `--help` and cold start must not load the flag schema."""

# Finding levels. `fix`: an edit is applied (safe, or unsafe with --unsafe-fixes);
# `unsafe`: an edit exists but needs --unsafe-fixes; `manual`: a person must act;
# `info`: a notice, never fails --check; `error`: a file or command could not be read.
FIX, UNSAFE, MANUAL, INFO, ERROR = "fix", "unsafe", "manual", "info", "error"

FORMATS = ("shell", "config", "k8s", "compose", "dockerfile", "yaml", "workflow", "helm", "makefile",
           "systemd", "supervisor", "env", "python", "requirements", "pyproject", "setupcfg", "pipfile",
           "lockfile", "notebook")

STDIN = "-"  # the path that means "read standard input"
