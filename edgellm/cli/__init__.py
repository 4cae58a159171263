"""The `edgellm` command line: its commands (commands.py), the model store's commands (models.py),
`edgellm bench` (bench.py), and argument types shared with the launchers (args.py)."""
