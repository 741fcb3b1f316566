"""The ``dnnctl`` command line: thin typer files that parse, call dnnctl.api and render."""
