"""``python -m dnnctl`` runs the command line (same as the ``dnnctl`` script)."""

from dnnctl.cli.app import main

main()
