"""The D-Bus edge: names, the io.rdmad1 service, caller credentials."""
