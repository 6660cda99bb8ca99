"""The ``boundedcode-gateway`` command line: one module per subcommand."""
