"""The `autotune` subcommands, one module each."""
