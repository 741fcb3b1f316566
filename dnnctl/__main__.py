"""``python -m dnnctl`` runs the command line (same as the ``dnnctl`` script)."""

from dnnctl.cli.entry import main

main()
