"""The validation pipeline: parse -> resolve every auto -> validate, producing diagnostics."""
