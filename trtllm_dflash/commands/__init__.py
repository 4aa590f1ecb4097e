"""One module per CLI subcommand; each exposes register(subparsers)."""
