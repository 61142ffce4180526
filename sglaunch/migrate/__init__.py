"""`migrate-flags`: rules as data, format readers/writers and one edit engine.

Layout: `rules` loads `migrations/*.yaml` into frozen `Rule`s; `shell`, `yamlfmt` and
`dockerfile` find SGLang launch commands and know how to edit their tokens in place;
`evaluate` turns rules plus one command into findings and token edits; `engine` applies
edits back to front, re-runs until stable and re-validates; `files` walks and writes.
Nothing here imports torch.
"""
